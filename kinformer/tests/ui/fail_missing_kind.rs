use kinformer::Informer;

#[derive(Informer)]
#[informer(group = "example.com", version = "v1")]
pub struct Foo {
    pub replicas: i32,
}

fn main() {}
