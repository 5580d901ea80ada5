//! `bench-client-mimalloc`: the same client as `bench-client` (`client/mod.rs`) with mimalloc as
//! the global allocator, wrapped in the same counting allocator, so the driver can run both
//! clients with either allocator in the same rounds.

use cap::Cap;
use mimalloc::MiMalloc;

mod client;

/// The counting allocator the client reads the live heap from.
#[global_allocator]
static ALLOC: Cap<MiMalloc> = Cap::new(MiMalloc, usize::MAX);

fn main() -> Result<(), client::BoxError> {
    client::main("mimalloc")
}
