//! The ring: which live shard an object belongs to, by rendezvous (highest random weight)
//! hashing.
//!
//! Where it sits: the [sharder](super::Sharder) asks it for every primary object it labels.
//!
//! Each (shard, object) pair gets a pseudo-random weight from a fixed hash of both names; the
//! object belongs to the shard of highest weight. Adding a shard moves only the objects the new
//! shard now wins (about 1/N of them, the minimum); removing one moves only that shard's
//! objects. No virtual nodes are needed for an even spread, and the result depends on the set
//! of shards alone, not on the order they joined in. The hash is FNV-1a followed by a
//! SplitMix64 finaliser: fixed across builds and platforms (unlike `std`'s `DefaultHasher`),
//! so a new sharder binary, after an upgrade, assigns every object as the old one did.

/// FNV-1a over `bytes`, continuing from `state`.
fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        state ^= u64::from(*b);
        state = state.wrapping_mul(0x0000_0100_0000_01b3);
    }
    state
}

/// SplitMix64's finaliser: spreads FNV's weak low bits over the whole word.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The weight of `object` on `shard`.
pub fn weight(shard: &str, object: &str) -> u64 {
    let state = fnv1a(0xcbf2_9ce4_8422_2325, shard.as_bytes());
    // A separator no name contains, so ("ab", "c") and ("a", "bc") differ.
    let state = fnv1a(state, &[0]);
    mix(fnv1a(state, object.as_bytes()))
}

/// The shard `object` (its `namespace/name`) belongs to among `shards`: the one of highest
/// [`weight`] (ties, which need a 64-bit collision, go to the smaller name). `None` when there
/// is no shard.
pub fn assign<'a, S: AsRef<str>>(shards: &'a [S], object: &str) -> Option<&'a str> {
    shards
        .iter()
        .map(AsRef::as_ref)
        .max_by(|a, b| weight(a, object).cmp(&weight(b, object)).then_with(|| b.cmp(a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("default/obj-{i}")).collect()
    }

    #[test]
    fn no_shard_no_assignment() {
        assert_eq!(assign::<&str>(&[], "default/a"), None);
    }

    #[test]
    fn order_of_shards_does_not_matter() {
        let a = ["s0", "s1", "s2"];
        let b = ["s2", "s0", "s1"];
        for key in keys(500) {
            assert_eq!(assign(&a, &key), assign(&b, &key));
        }
    }

    #[test]
    fn spread_is_even_within_ten_percent() {
        let shards = ["shard-0", "shard-1", "shard-2"];
        let mut counts = [0usize; 3];
        for key in keys(30_000) {
            let s = assign(&shards, &key).unwrap();
            counts[shards.iter().position(|x| *x == s).unwrap()] += 1;
        }
        for c in counts {
            assert!((9_000..=11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn a_fourth_shard_moves_about_a_quarter_and_only_to_itself() {
        let three = ["shard-0", "shard-1", "shard-2"];
        let four = ["shard-0", "shard-1", "shard-2", "shard-3"];
        let all = keys(20_000);
        let mut moved = 0;
        for key in &all {
            let (before, after) = (assign(&three, key).unwrap(), assign(&four, key).unwrap());
            if before != after {
                assert_eq!(after, "shard-3", "{key} moved between old shards");
                moved += 1;
            }
        }
        let share = moved as f64 / all.len() as f64;
        assert!((0.25 / 1.3..=0.25 * 1.3).contains(&share), "moved share {share}");
    }

    #[test]
    fn removing_a_shard_moves_only_its_objects() {
        let three = ["shard-0", "shard-1", "shard-2"];
        let two = ["shard-0", "shard-2"];
        for key in keys(5_000) {
            let before = assign(&three, &key).unwrap();
            if before != "shard-1" {
                assert_eq!(assign(&two, &key), Some(before));
            }
        }
    }
}
