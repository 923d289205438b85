//! The CPU side of a plan: the rayon pool a run executes in. The kernel choices themselves
//! travel as a value ([`crate::plan::Plan::kernels`]) in the model the run owns.

use super::RunError;
use crate::plan::Plan;
use mindxtrain_kernels::KernelConfig;

/// The plan's kernel settings, or why the plan cannot be run.
pub fn plan_kernels(plan: &Plan) -> Result<KernelConfig, RunError> {
    plan.kernels().map_err(|e| RunError::Recipe(format!("plan: {e}")))
}

/// Builds the rayon pool a run executes in. candle's own matmul sizes its parallelism from the
/// machine (or `RAYON_NUM_THREADS` when the operator sets it) and runs inside this pool; its
/// summation order does not depend on the thread count, so results stay bitwise equal across
/// choices. Nothing process-wide is changed: a server may run a training and a serving pool
/// side by side.
pub fn thread_pool(threads: usize) -> Result<rayon::ThreadPool, RunError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("mindxtrain-cpu-{i}"))
        .build()
        .map_err(|e| RunError::Io { path: "thread pool".into(), message: e.to_string() })
}
