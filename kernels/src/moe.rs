//! The ops of a mixture-of-experts MLP (Qwen3-MoE's sparse block), dropless: every token goes to
//! its `k` experts, no capacity limit, nothing dropped.
//!
//! ```text
//! x [N, H] ─ router logits [N, E] ─▶ router::forward ─▶ experts [N, k], weights [N, k]
//!                                          │
//!                                 Groups::new: the N·k (token, slot) pairs sorted by expert
//!                                          ▼  (stable: token order inside an expert)
//! grouped::forward_sum  x rows gathered · W_gate_up[e]ᵀ  ─▶ [N·k, 2F] ─▶ glu ─▶ [N·k, F]
//! grouped::forward_sum  · W_down[e]ᵀ ─▶ [N·k, H] ─▶ combine (Σ_j weight·row, token order) ─▶ [N, H]
//! ```
//!
//! * [`router`]: softmax over the experts, top-k (ties to the lower expert), `norm_topk_prob`;
//!   the backward also takes the load-balancing and z-loss terms.
//! * [`Groups`]: the sort, on the device the routing is on (a counting sort: deterministic).
//! * [`grouped`]: GEMMs over all experts in one call: forward, input gradient, weight gradient.
//!   Rows of one expert are contiguous; the forward and the weight gradient read token rows
//!   through the sort (`gathered`), so the permuted copy of `x` never exists.
//! * [`glu`]: SwiGLU on the fused `[gate | up]` rows.
//! * [`combine`]: the weighted sum back to token order, its backward, and the sum of a token's
//!   rows (the backward of the gather).
//!
//! Each op has a composed candle `reference` (the referee: per-expert GEMMs over the sorted
//! rows) and a fused CPU kernel (f32 and f64); on a GPU the grouped GEMMs are one cuBLAS grouped
//! GEMM per term over every expert (`gpu::grouped`), the other ops their composed forms. Nothing uses atomics:
//! every sum runs in an order fixed by the routing and the plan ([`MoeKernels`]), so results do
//! not depend on thread counts.

pub mod combine;
mod cpu;
pub mod glu;
pub mod grouped;
mod groups;
mod kernels;
pub mod router;

pub use groups::Groups;
pub use kernels::{ExpertOrder, GroupedTile, MoeKernels};
