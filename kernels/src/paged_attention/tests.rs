use super::*;
use crate::attention::{self, Mask};
use crate::gradcheck::{assert_close, random};
use proptest::prelude::*;

const BS: usize = 4;

/// Three sequences over scattered blocks of one cache: a prefill chunk that starts the
/// sequence, a later chunk of a longer one, and a single decode row.
fn batch() -> (Vec<Vec<u32>>, Vec<(usize, usize)>) {
    let tables = vec![vec![5, 2, 7], vec![0, 9, 3, 4, 8], vec![6, 1]];
    let lens = vec![(9, 9), (5, 18), (1, 6)];
    (tables, lens)
}

fn meta(tables: &[Vec<u32>], lens: &[(usize, usize)]) -> Result<PagedMeta> {
    let seqs: Vec<SeqSlice> = tables
        .iter()
        .zip(lens)
        .map(|(b, &(query_len, context_len))| SeqSlice { query_len, context_len, blocks: b })
        .collect();
    PagedMeta::new(BS, &seqs, &Device::Cpu)
}

#[test]
fn the_fused_kernel_matches_the_reference_in_f64_and_f32() -> Result<()> {
    let (tables, lens) = batch();
    let meta = meta(&tables, &lens)?;
    let (heads, kv, hd) = (6, 2, 8);
    let q = random(&[meta.rows(), heads, hd], 1, &Device::Cpu)?;
    let (kc, vc) = (random(&[10, BS, kv, hd], 2, &Device::Cpu)?, random(&[10, BS, kv, hd], 3, &Device::Cpu)?);
    let want = reference::forward(&q, &kc, &vc, &meta, 0.4)?;
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-6)] {
        let c = |t: &Tensor| t.to_dtype(dtype);
        assert_close(&forward(&c(&q)?, &c(&kc)?, &c(&vc)?, &meta, 0.4)?, &want, tol)?;
    }
    Ok(())
}

#[test]
fn paged_attention_equals_causal_attention_over_the_whole_sequence() -> Result<()> {
    // A 10-token sequence whose keys and values are written through its block table: the
    // attention of its last rows read from the cache equals causal attention of the whole.
    let (heads, kv, hd, s) = (4, 2, 8, 10);
    let (q, k, v) = (
        random(&[1, heads, s, hd], 4, &Device::Cpu)?,
        random(&[1, kv, s, hd], 5, &Device::Cpu)?,
        random(&[1, kv, s, hd], 6, &Device::Cpu)?,
    );
    let (full, _) = attention::reference::forward(&q, &k, &v, &Mask::new(&[1; 10], 1, s)?, 0.3)?;
    let table = [3u32, 0, 6];
    let (kc, vc) = (
        Tensor::zeros((7, BS, kv, hd), DType::F64, &Device::Cpu)?,
        Tensor::zeros((7, BS, kv, hd), DType::F64, &Device::Cpu)?,
    );
    let whole = PagedMeta::new(BS, &[SeqSlice { query_len: s, context_len: s, blocks: &table }], &Device::Cpu)?;
    let rows = |t: &Tensor| t.squeeze(0)?.transpose(0, 1)?.contiguous();
    write_kv(&kc, &vc, &rows(&k)?, &rows(&v)?, &Tensor::new(whole.slots().as_slice(), &Device::Cpu)?)?;
    for t in [s, 3, 1] {
        let m = PagedMeta::new(BS, &[SeqSlice { query_len: t, context_len: s, blocks: &table }], &Device::Cpu)?;
        let got = forward(&rows(&q)?.narrow(0, s - t, t)?, &kc, &vc, &m, 0.3)?;
        assert_close(&got, &rows(&full)?.narrow(0, s - t, t)?, 1e-12)?;
    }
    Ok(())
}

#[test]
fn kv_write_matches_the_scatter_reference_and_touches_only_its_slots() -> Result<()> {
    let (kv, hd) = (2, 3);
    let slots = Tensor::new(&[13u32, 2, 7], &Device::Cpu)?;
    let (k, v) = (random(&[3, kv, hd], 7, &Device::Cpu)?, random(&[3, kv, hd], 8, &Device::Cpu)?);
    for dtype in [DType::F64, DType::F32, DType::BF16] {
        let fresh = || random(&[4, BS, kv, hd], 9, &Device::Cpu)?.to_dtype(dtype);
        let (kc, vc, kr, vr) = (fresh()?, fresh()?, fresh()?, fresh()?);
        let before = kc.copy()?;
        write_kv(&kc, &vc, &k.to_dtype(dtype)?, &v.to_dtype(dtype)?, &slots)?;
        reference::write_kv(&kr, &vr, &k.to_dtype(dtype)?, &v.to_dtype(dtype)?, &slots)?;
        assert_close(&kc, &kr, 0.0)?;
        assert_close(&vc, &vr, 0.0)?;
        let flat = |t: &Tensor| t.reshape((16, kv * hd))?.to_dtype(DType::F64)?.to_vec2::<f64>();
        let (after, before) = (flat(&kc)?, flat(&before)?);
        for slot in 0..16 {
            assert_eq!(after[slot] != before[slot], [13, 2, 7].contains(&slot), "slot {slot} {dtype:?}");
        }
    }
    let bad = Tensor::new(&[16u32, 0, 0], &Device::Cpu)?;
    let kc = Tensor::zeros((4, BS, kv, hd), DType::F32, &Device::Cpu)?;
    assert!(write_kv(&kc, &kc.copy()?, &k.to_dtype(DType::F32)?, &v.to_dtype(DType::F32)?, &bad).is_err());
    Ok(())
}

#[test]
fn prepare_normalises_rotates_and_stores_the_keys() -> Result<()> {
    let (n, heads, kv, hd) = (3, 4, 2, 8);
    let dev = Device::Cpu;
    let (q, k, v) =
        (random(&[n, heads, hd], 10, &dev)?, random(&[n, kv, hd], 11, &dev)?, random(&[n, kv, hd], 12, &dev)?);
    let (qn, kn) = (random(&[hd], 13, &dev)?, random(&[hd], 14, &dev)?);
    let (cos, sin) = rope::tables(&[0, 5, 9], hd, 10_000.0, DType::F64, &dev)?;
    let (kc, vc) =
        (Tensor::zeros((2, BS, kv, hd), DType::F64, &dev)?, Tensor::zeros((2, BS, kv, hd), DType::F64, &dev)?);
    let slots = Tensor::new(&[0u32, 5, 6], &dev)?;
    let qkv = Tensor::cat(&[&q, &k, &v], 1)?.reshape((n, (heads + 2 * kv) * hd))?;
    let got = prepare(&qkv, heads, Some((&qn, &kn, 1e-6)), &cos, &sin, (&kc, &vc), &slots)?;
    // A packed row of the wrong width is refused, not read past.
    assert!(
        prepare(&qkv.narrow(1, 0, (heads + kv) * hd)?, heads, Some((&qn, &kn, 1e-6)), &cos, &sin, (&kc, &vc), &slots)
            .is_err()
    );
    let rot = |x: &Tensor, w: &Tensor| {
        let (c, s) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
        rope::reference::forward(&rmsnorm::reference::forward(x, w, 1e-6)?.0, &c, &s)
    };
    assert_close(&got, &rot(&q, &qn)?, 1e-12)?;
    let stored = kc.reshape((8, kv, hd))?.index_select(&slots, 0)?;
    assert_close(&stored, &rot(&k, &kn)?, 1e-12)?;
    assert_close(&vc.reshape((8, kv, hd))?.index_select(&slots, 0)?, &v, 0.0)?;
    // Without norms (q and k normalised already, over the whole projection) only the rotation.
    let (kc, vc) =
        (Tensor::zeros((2, BS, kv, hd), DType::F64, &dev)?, Tensor::zeros((2, BS, kv, hd), DType::F64, &dev)?);
    let got = prepare(&qkv, heads, None, &cos, &sin, (&kc, &vc), &slots)?;
    let (c, s) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
    assert_close(&got, &rope::reference::forward(&q, &c, &s)?, 1e-12)?;
    let stored = kc.reshape((8, kv, hd))?.index_select(&slots, 0)?;
    assert_close(&stored, &rope::reference::forward(&k, &c, &s)?, 1e-12)?;
    Ok(())
}

#[test]
fn bad_batches_are_refused_with_the_sequence_named() {
    let blocks = [0u32, 1];
    let err = |query_len, context_len| {
        PagedMeta::new(BS, &[SeqSlice { query_len, context_len, blocks: &blocks }], &Device::Cpu)
            .unwrap_err()
            .to_string()
    };
    assert!(err(0, 3).contains("sequence 0"));
    assert!(err(4, 3).contains("4 new of 3"));
    assert!(err(1, 9).contains("2 blocks"));
    assert!(PagedMeta::new(0, &[SeqSlice { query_len: 1, context_len: 1, blocks: &blocks }], &Device::Cpu).is_err());
    // A table naming a block the cache lacks.
    let meta = PagedMeta::new(BS, &[SeqSlice { query_len: 1, context_len: 8, blocks: &[0, 9] }], &Device::Cpu).unwrap();
    let c = Tensor::zeros((4, BS, 1, 2), DType::F32, &Device::Cpu).unwrap();
    let q = Tensor::zeros((1, 1, 2), DType::F32, &Device::Cpu).unwrap();
    assert!(forward(&q, &c, &c, &meta, 1.0).is_err());
}

proptest! {
    /// Random batches (sequences, chunk sizes, contexts, tables drawn from a shuffled pool):
    /// the fused kernel agrees with the reference.
    #[test]
    fn random_batches_agree_with_the_reference(
        seqs in proptest::collection::vec((1usize..6, 0usize..12), 1..5),
        seed in 0u64..1000,
    ) {
        let mut next = 0u32;
        let mut tables = Vec::new();
        let mut lens = Vec::new();
        for &(t, extra) in &seqs {
            let ctx = t + extra;
            let blocks = ctx.div_ceil(BS);
            // Reverse order inside each table, so no table is contiguous.
            tables.push((next..next + blocks as u32).rev().collect::<Vec<u32>>());
            next += blocks as u32;
            lens.push((t, ctx));
        }
        let meta = meta(&tables, &lens).unwrap();
        let q = random(&[meta.rows(), 4, 4], seed, &Device::Cpu).unwrap();
        let kc = random(&[next as usize, BS, 2, 4], seed + 1, &Device::Cpu).unwrap();
        let vc = random(&[next as usize, BS, 2, 4], seed + 2, &Device::Cpu).unwrap();
        let want = reference::forward(&q, &kc, &vc, &meta, 0.5).unwrap();
        assert_close(&forward(&q, &kc, &vc, &meta, 0.5).unwrap(), &want, 1e-12).unwrap();
    }
}
