use kinformer::Informer;

#[derive(Informer)]
#[informer(version = "v1", kind = "Foo")]
pub struct Foo(i32);

fn main() {}
