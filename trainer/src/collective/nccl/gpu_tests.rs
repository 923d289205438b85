//! NCCL on the GPU at world size 1 (`scripts/gpu-test` runs these on any GPU machine).

use super::Nccl;
use crate::collective::{Abort, Collective, even_spans};
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;
use std::time::Duration;

/// NCCL reads an input only after the compute-stream kernels that wrote it. Each bucket is the
/// output of a candle kernel queued behind a long chain of products (~100 ms of f32 GEMMs), and
/// is handed to NCCL the moment it is queued; the all-reduce, reduce-scatter and all-gather of
/// one rank must give it back bit for bit. Ordered by the buffers' events alone, NCCL's copy ran
/// before the chain ended: candle records no write event for its kernels' outputs. Each result is
/// then read by a candle copy kernel queued at once: with NCCL's outputs allocated on NCCL's
/// stream, that kernel did not wait for NCCL's write (ZeRO's gathered weights went NaN).
#[test]
fn nccl_reads_inputs_after_the_kernels_that_wrote_them() {
    let device = Device::new_cuda(0).expect("a CUDA device (scripts/gpu-test)");
    let id = Nccl::unique_id().expect("ncclGetUniqueId");
    let mut nccl = Nccl::new(&device, 0, 1, &id, Duration::from_secs(120), Arc::new(Abort::new()))
        .expect("a one-rank communicator");
    let a = Tensor::randn(0f32, 0.015, (4096, 4096), &device).unwrap();
    for round in 0..3 {
        let chain = |scale: f64| -> Tensor {
            let mut x = a.clone();
            for _ in 0..12 {
                x = x.matmul(&a).unwrap();
            }
            // The last writer is a candle kernel (affine, then a concatenation), not cuBLAS.
            Tensor::cat(&[&x.affine(scale, 1.0).unwrap().flatten_all().unwrap(), &a.flatten_all().unwrap()], 0).unwrap()
        };
        let bucket = chain(2.0);
        let reduced = nccl.all_reduce(&bucket).unwrap();
        let scattered = nccl.reduce_scatter(&chain(3.0), &even_spans(bucket.elem_count(), 1)).unwrap();
        let gathered = nccl.all_gather(&chain(4.0), &even_spans(bucket.elem_count(), 1)).unwrap();
        // Each result read at once by a candle copy kernel (`cat` runs `copy2d`, which orders
        // itself against the stream its source was allocated on), before anything waits.
        let [reduced, scattered, gathered] = [&reduced, &scattered, &gathered]
            .map(|t| Tensor::cat(&[t, t], 0).unwrap().narrow(0, t.elem_count(), t.elem_count()).unwrap());
        let host = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        for (what, got, scale) in
            [("all-reduce", &reduced, 2.0), ("reduce-scatter", &scattered, 3.0), ("all-gather", &gathered, 4.0)]
        {
            let want = host(&chain(scale));
            let got = host(got);
            let wrong = got.iter().zip(&want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
            assert_eq!(wrong, 0, "round {round}: {what} returned {wrong} of {} elements unlike its input", want.len());
        }
    }
}
