//! `bench-client`: the benchmark's client (`client/mod.rs`, where its flags and workloads are
//! described) with glibc's malloc, the system allocator, as the global allocator, wrapped in a
//! counting allocator for the heap figures.

use std::alloc::System;

use cap::Cap;

mod client;

/// The counting allocator the client reads the live heap from.
#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

fn main() -> Result<(), client::BoxError> {
    client::main("glibc")
}
