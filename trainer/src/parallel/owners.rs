//! Which rank keeps which tensor when a run shards (ZeRO): whole tensors, balanced by size.
//!
//! Whole tensors rather than even slices of one flat buffer: a tensor's optimizer update and its
//! gradient's norm are then computed by one rank exactly as an unsharded run computes them, so
//! sharded training gives the same bytes as unsharded training, and checkpoints keep HF names.
//! With hundreds of tensors per model and a handful of ranks the balance is within one tensor.

use std::collections::BTreeMap;

/// The owner of every sharded tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owners {
    world: usize,
    owner: BTreeMap<String, usize>,
    elems: BTreeMap<String, usize>,
}

impl Owners {
    /// Assigns each `(name, element count)` to a rank: largest first (ties by name), each to the
    /// rank holding the fewest elements so far (ties: the lowest rank). The same tensors give the
    /// same owners on every rank.
    pub fn assign<'a>(tensors: impl IntoIterator<Item = (&'a str, usize)>, world: usize) -> Owners {
        let world = world.max(1);
        let elems: BTreeMap<String, usize> = tensors.into_iter().map(|(n, e)| (n.to_string(), e)).collect();
        let mut order: Vec<(&String, &usize)> = elems.iter().collect();
        order.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        let mut load = vec![0usize; world];
        let mut owner = BTreeMap::new();
        for (name, &n) in order {
            let rank = (0..world).min_by_key(|&r| (load[r], r)).unwrap_or(0);
            load[rank] += n;
            owner.insert(name.clone(), rank);
        }
        Owners { world, owner, elems }
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// The rank that keeps `name`; `None` for a tensor that is not sharded.
    pub fn owner(&self, name: &str) -> Option<usize> {
        self.owner.get(name).copied()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.owner.contains_key(name)
    }

    /// Whether `rank` keeps `name` (every rank keeps what is not sharded).
    pub fn keeps(&self, name: &str, rank: usize) -> bool {
        self.owner(name).is_none_or(|o| o == rank)
    }

    /// Elements each rank keeps.
    pub fn loads(&self) -> Vec<usize> {
        let mut load = vec![0; self.world];
        for (name, &r) in &self.owner {
            load[r] += self.elems[name];
        }
        load
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.owner.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_are_spread_by_size_and_the_same_everywhere() {
        let t = [("a", 100), ("b", 60), ("c", 50), ("d", 10), ("e", 0)];
        let o = Owners::assign(t.iter().map(|(n, e)| (*n, *e)), 2);
        assert_eq!(o.owner("a"), Some(0));
        assert_eq!(o.owner("b"), Some(1));
        assert_eq!(o.owner("c"), Some(1));
        assert_eq!(o.owner("d"), Some(0));
        assert_eq!(o.loads(), vec![110, 110]);
        assert_eq!(o, Owners::assign(t.iter().rev().map(|(n, e)| (*n, *e)), 2));
        assert!(o.keeps("unsharded", 1) && o.keeps("a", 0) && !o.keeps("a", 1));
        let one = Owners::assign(t.iter().map(|(n, e)| (*n, *e)), 1);
        assert!(one.names().all(|n| one.owner(n) == Some(0)));
    }

    #[test]
    fn a_large_model_balances_within_one_tensor() {
        // 64 blocks of seven projections and two norms, an embedding and a head.
        let mut t = vec![("embed".to_string(), 151_936 * 5120), ("head".to_string(), 151_936 * 5120)];
        for l in 0..64 {
            for (p, n) in [("q", 5120 * 8192), ("k", 5120 * 1024), ("v", 5120 * 1024), ("o", 8192 * 5120)] {
                t.push((format!("{l}.{p}"), n));
            }
            for p in ["gate", "up", "down"] {
                t.push((format!("{l}.{p}"), 5120 * 25_600));
            }
            t.push((format!("{l}.norm1"), 5120));
            t.push((format!("{l}.norm2"), 5120));
        }
        let o = Owners::assign(t.iter().map(|(n, e)| (n.as_str(), *e)), 8);
        let loads = o.loads();
        let (lo, hi) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
        assert!(hi - lo <= 5120 * 25_600, "{loads:?}");
    }
}
