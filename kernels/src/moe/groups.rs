//! The (token, slot) pairs of a routing sorted by expert: a counting sort, stable (inside an
//! expert, token order, then slot order), so the layout, and every sum over it, depends only on
//! the routing. It is built on the host (the routing is read back from a GPU: one small copy per
//! layer) and uploaded to the routing's device.

use candle_core::{Device, Result, Tensor};

/// The sorted layout: sorted row `p` is slot `slots[p]` = `token·k + j` (the token's `j`-th
/// expert) and holds token `rows[p]`; expert `e` owns rows `offsets[e]..offsets[e + 1]`.
#[derive(Debug, Clone)]
pub struct Groups {
    pub num_experts: usize,
    pub k: usize,
    pub tokens: usize,
    /// `[N·k]` u32: the token of each sorted row.
    pub rows: Tensor,
    /// `[N·k]` u32: the slot (`token·k + j`) of each sorted row.
    pub slots: Tensor,
    /// `[N·k]` u32: the sorted row of each slot (the inverse of `slots`).
    pub positions: Tensor,
    /// `[E + 1]` u32: where each expert's rows start, and the total.
    pub offsets: Tensor,
    /// `[E]` u32: the experts by number of rows, most first, ties by id.
    pub by_size: Tensor,
    /// The same on the host (the CPU kernels index with these; the references split by them).
    pub(crate) host: Option<HostGroups>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostGroups {
    pub rows: Vec<u32>,
    pub slots: Vec<u32>,
    pub positions: Vec<u32>,
    pub offsets: Vec<usize>,
    pub by_size: Vec<u32>,
}

impl HostGroups {
    /// The counting sort of `experts` (`[N·k]`, row-major `[N, k]`).
    pub fn sort(experts: &[u32], k: usize, num_experts: usize) -> Result<HostGroups> {
        let m = experts.len();
        let mut counts = vec![0usize; num_experts];
        for &e in experts {
            if e as usize >= num_experts {
                candle_core::bail!("moe groups: expert {e} of {num_experts}");
            }
            counts[e as usize] += 1;
        }
        let mut offsets = vec![0usize; num_experts + 1];
        for e in 0..num_experts {
            offsets[e + 1] = offsets[e] + counts[e];
        }
        let mut next = offsets.clone();
        let (mut rows, mut slots, mut positions) = (vec![0u32; m], vec![0u32; m], vec![0u32; m]);
        for (s, &e) in experts.iter().enumerate() {
            let p = next[e as usize];
            next[e as usize] += 1;
            rows[p] = (s / k) as u32;
            slots[p] = s as u32;
            positions[s] = p as u32;
        }
        let mut by_size: Vec<u32> = (0..num_experts as u32).collect();
        by_size.sort_by(|&a, &b| counts[b as usize].cmp(&counts[a as usize]).then(a.cmp(&b)));
        Ok(HostGroups { rows, slots, positions, offsets, by_size })
    }
}

impl Groups {
    /// Sorts the routing `experts` (`[N, k]` u32) of `num_experts` experts, on its device.
    pub fn new(experts: &Tensor, num_experts: usize) -> Result<Groups> {
        let _profile = crate::profile::scope("moe groups", experts.device());
        let (tokens, k) = experts.dims2()?;
        if num_experts == 0 || k == 0 || k > num_experts {
            candle_core::bail!("moe groups: {k} experts per token of {num_experts}");
        }
        let host = HostGroups::sort(&experts.flatten_all()?.to_vec1::<u32>()?, k, num_experts)?;
        Groups::from_host(host, tokens, k, num_experts, experts.device())
    }

    pub(crate) fn from_host(
        host: HostGroups,
        tokens: usize,
        k: usize,
        num_experts: usize,
        device: &Device,
    ) -> Result<Groups> {
        let u32s = |v: &[u32]| Tensor::new(v, device);
        let offsets: Vec<u32> = host.offsets.iter().map(|&o| o as u32).collect();
        Ok(Groups {
            num_experts,
            k,
            tokens,
            rows: u32s(&host.rows)?,
            slots: u32s(&host.slots)?,
            positions: u32s(&host.positions)?,
            offsets: u32s(&offsets)?,
            by_size: u32s(&host.by_size)?,
            host: Some(host),
        })
    }

    /// Sorted rows in all (`N·k`).
    pub fn len(&self) -> usize {
        self.tokens * self.k
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The host layout; on a GPU read back (tests, the CPU reference).
    pub(crate) fn host(&self) -> Result<std::borrow::Cow<'_, HostGroups>> {
        if let Some(h) = &self.host {
            return Ok(std::borrow::Cow::Borrowed(h));
        }
        let v = |t: &Tensor| t.to_vec1::<u32>();
        Ok(std::borrow::Cow::Owned(HostGroups {
            rows: v(&self.rows)?,
            slots: v(&self.slots)?,
            positions: v(&self.positions)?,
            offsets: v(&self.offsets)?.into_iter().map(|o| o as usize).collect(),
            by_size: v(&self.by_size)?,
        }))
    }

    /// Rows per expert.
    pub fn counts(&self) -> Result<Vec<usize>> {
        Ok(self.host()?.offsets.windows(2).map(|w| w[1] - w[0]).collect())
    }

    /// `x` `[N, d]` gathered into sorted order `[N·k, d]` (a token's row once per expert).
    pub fn gather(&self, x: &Tensor) -> Result<Tensor> {
        x.index_select(&self.rows, 0)
    }

    /// The groups of the sorted rows whose token `keep` selects (`keep[token]`), in the same
    /// order: the rows of one adapter in a mixed serving batch. Returns the groups and, per kept
    /// row, its sorted row in `self`.
    pub fn select_tokens(&self, keep: &[bool]) -> Result<(Groups, Tensor)> {
        if keep.len() != self.tokens {
            candle_core::bail!("moe groups: {} token flags for {} tokens", keep.len(), self.tokens);
        }
        let h = self.host()?;
        let kept: Vec<u32> = (0..self.tokens as u32).filter(|&t| keep[t as usize]).collect();
        let mut new_token = vec![u32::MAX; self.tokens];
        for (i, &t) in kept.iter().enumerate() {
            new_token[t as usize] = i as u32;
        }
        let (mut rows, mut slots, mut parent) = (Vec::new(), Vec::new(), Vec::new());
        let mut offsets = vec![0usize; self.num_experts + 1];
        for e in 0..self.num_experts {
            for p in h.offsets[e]..h.offsets[e + 1] {
                let t = h.rows[p] as usize;
                if keep[t] {
                    rows.push(new_token[t]);
                    slots.push(new_token[t] * self.k as u32 + h.slots[p] % self.k as u32);
                    parent.push(p as u32);
                }
            }
            offsets[e + 1] = rows.len();
        }
        let mut positions = vec![0u32; rows.len()];
        for (p, &s) in slots.iter().enumerate() {
            positions[s as usize] = p as u32;
        }
        let counts: Vec<usize> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
        let mut by_size: Vec<u32> = (0..self.num_experts as u32).collect();
        by_size.sort_by(|&a, &b| counts[b as usize].cmp(&counts[a as usize]).then(a.cmp(&b)));
        let host = HostGroups { rows, slots, positions, offsets, by_size };
        let dev = self.rows.device();
        let groups = Groups::from_host(host, kept.len(), self.k, self.num_experts, dev)?;
        Ok((groups, Tensor::new(parent.as_slice(), dev)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every slot appears exactly once, experts' rows are contiguous and in token order, and
        /// positions invert slots: the sort is dropless and stable.
        #[test]
        fn the_sort_is_a_stable_dropless_permutation(
            (e, k, experts) in (2usize..9, 1usize..4).prop_flat_map(|(e, k)| {
                let k = k.min(e);
                (Just(e), Just(k), prop::collection::vec(0u32..e as u32, 0..40).prop_map(move |mut v| {
                    v.truncate(v.len() / k * k);
                    v
                }))
            })
        ) {
            let h = HostGroups::sort(&experts, k, e).unwrap();
            let m = experts.len();
            prop_assert_eq!(h.offsets[e], m);
            let mut seen = vec![false; m];
            for x in 0..e {
                let rows = &h.slots[h.offsets[x]..h.offsets[x + 1]];
                prop_assert!(rows.windows(2).all(|w| w[0] < w[1]), "stable: slot order inside an expert");
                for &s in rows {
                    prop_assert_eq!(experts[s as usize], x as u32);
                    prop_assert!(!seen[s as usize]);
                    seen[s as usize] = true;
                }
            }
            prop_assert!(seen.iter().all(|&b| b));
            for s in 0..m {
                prop_assert_eq!(h.slots[h.positions[s] as usize] as usize, s);
                prop_assert_eq!(h.rows[h.positions[s] as usize] as usize, s / k);
            }
            let counts: Vec<usize> = h.offsets.windows(2).map(|w| w[1] - w[0]).collect();
            let ordered = h.by_size.windows(2).all(|w| {
                let (a, b) = (counts[w[0] as usize], counts[w[1] as usize]);
                a > b || (a == b && w[0] < w[1])
            });
            prop_assert!(ordered, "by_size: most rows first, ties by id");
        }
    }

    #[test]
    fn selecting_tokens_keeps_their_rows_in_order() -> Result<()> {
        let experts = Tensor::new(&[[2u32, 0], [1, 2], [0, 1], [2, 1]], &Device::Cpu)?;
        let g = Groups::new(&experts, 3)?;
        assert_eq!(g.counts()?, [2, 3, 3]);
        let (sub, parent) = g.select_tokens(&[true, false, true, true])?;
        assert_eq!(sub.tokens, 3);
        assert_eq!(sub.counts()?, [2, 2, 2]);
        let hp = g.host()?;
        for (q, &p) in parent.to_vec1::<u32>()?.iter().enumerate() {
            let token = [0u32, 2, 3][sub.rows.to_vec1::<u32>()?[q] as usize];
            assert_eq!(hp.rows[p as usize], token);
        }
        assert!(Groups::new(&Tensor::new(&[[3u32]], &Device::Cpu)?, 3).is_err());
        Ok(())
    }
}
