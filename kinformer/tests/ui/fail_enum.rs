use kinformer::Informer;

#[derive(Informer)]
#[informer(version = "v1", kind = "Foo")]
pub enum Foo {
    A,
}

fn main() {}
