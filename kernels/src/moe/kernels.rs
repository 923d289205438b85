//! The tunables of the grouped GEMMs, as the plan chooses them: the tile and the order in which
//! experts' tiles are handed out. Both change speed; the order never changes a result. A tile
//! changes which rows share one GEMM call, and the GEMM's own blocking may round the last bit
//! differently for a different row count: results agree to rounding across tiles and are
//! bit-identical across runs and thread counts for one plan.

use serde::{Deserialize, Serialize};

/// Output tile of one task: the CPU kernels hand out blocks of this many rows of one expert.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupedTile {
    /// 64 rows × 64 columns.
    #[default]
    M64N64,
    /// 128 × 64: fewer, larger tiles where experts have many rows.
    M128N64,
    /// 64 × 128: wide outputs (the fused gate/up projection).
    M64N128,
    /// 32 × 64: more, smaller tasks where experts have few rows.
    Simt,
}

impl GroupedTile {
    pub const ALL: [GroupedTile; 4] =
        [GroupedTile::M64N64, GroupedTile::M128N64, GroupedTile::M64N128, GroupedTile::Simt];

    /// `(rows, columns)` of one tile.
    pub fn dims(self) -> (usize, usize) {
        match self {
            GroupedTile::M64N64 => (64, 64),
            GroupedTile::M128N64 => (128, 64),
            GroupedTile::M64N128 => (64, 128),
            GroupedTile::Simt => (32, 64),
        }
    }
}

/// In which order the experts' tiles are handed out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertOrder {
    /// Expert 0's tiles first, then expert 1's…
    #[default]
    ById,
    /// The experts with the most rows first (ties by id): the long tasks start early, so the
    /// last wave is not one large expert alone (longest-processing-time first).
    LargestFirst,
}

/// The grouped GEMMs' settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeKernels {
    #[serde(default)]
    pub tile: GroupedTile,
    #[serde(default)]
    pub order: ExpertOrder,
}

impl MoeKernels {
    /// Every combination, the default first.
    pub fn candidates() -> Vec<MoeKernels> {
        let mut out = vec![MoeKernels::default()];
        for tile in GroupedTile::ALL {
            for order in [ExpertOrder::ById, ExpertOrder::LargestFirst] {
                let c = MoeKernels { tile, order };
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_distinct_and_start_with_the_default() {
        let c = MoeKernels::candidates();
        assert_eq!(c.len(), 8);
        assert_eq!(c[0], MoeKernels::default());
        let json = serde_json::to_string(&MoeKernels { tile: GroupedTile::M128N64, order: ExpertOrder::LargestFirst })
            .unwrap();
        assert_eq!(json, r#"{"tile":"m128_n64","order":"largest_first"}"#);
        let back: MoeKernels = serde_json::from_str("{}").unwrap();
        assert_eq!(back, MoeKernels::default());
    }
}
