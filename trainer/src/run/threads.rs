//! Applying the plan to the kernels: CPU choices (thread count, matmul blocking), the GPU
//! attention kernels and the GEMM algorithm of each shape. All are process-wide and set once
//! before the first step.

use super::RunError;
use crate::plan::{Choices, Plan};

/// Applies the whole plan (its choices and its GEMM table) and returns the pool to run in.
pub fn apply_plan(plan: &Plan) -> Result<rayon::ThreadPool, RunError> {
    mindxtrain_kernels::gemm_algos::set_gemm_algos(plan.gemm_algos())
        .map_err(|e| RunError::Recipe(format!("plan: {e}")))?;
    apply_choices(&plan.choices)
}

/// Applies every process-wide choice of one candidate and returns the pool to run in.
pub fn apply_choices(c: &Choices) -> Result<rayon::ThreadPool, RunError> {
    mindxtrain_kernels::linear::set_block_rows(c.gemm_rows);
    mindxtrain_kernels::attention::set_kernels(c.attention).map_err(|e| RunError::Recipe(format!("plan: {e}")))?;
    apply_threads(c.threads)
}

/// Builds the rayon pool the run executes in and points candle's matmul at the same
/// count. candle sizes its GEMM parallelism from `RAYON_NUM_THREADS` on every call, so
/// the variable is set too; summation order in candle's kernels does not depend on the
/// thread count, which keeps results bitwise equal across choices.
pub fn apply_threads(threads: usize) -> Result<rayon::ThreadPool, RunError> {
    let threads = threads.max(1);
    // SAFETY: called before the run starts any kernel; the only concurrent readers of the
    // environment would be candle ops, and none is running on any thread at this point.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.to_string()) };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("mindxtrain-cpu-{i}"))
        .build()
        .map_err(|e| RunError::Io { path: "thread pool".into(), message: e.to_string() })
}
