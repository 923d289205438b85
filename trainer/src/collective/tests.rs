//! The mesh with ranks as threads on loopback: sums in rank order, bit for bit; uneven spans;
//! every failure a clear error within the timeout.

use super::*;
use candle_core::{DType, Device, Tensor};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

/// Runs `f(rank, mesh)` on `world` threads connected by a mesh; returns their results by rank.
pub(crate) fn with_mesh<T: Send + 'static>(
    world: usize,
    timeout: Duration,
    f: impl Fn(usize, Mesh) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let listeners: Vec<TcpListener> = (0..world).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let f = Arc::new(f);
    let (tx, rx) = channel();
    for (rank, l) in listeners.into_iter().enumerate() {
        let (addrs, f, tx) = (addrs.clone(), f.clone(), tx.clone());
        std::thread::spawn(move || {
            let mesh = Mesh::connect(rank, &addrs, l, timeout, Arc::new(Abort::new())).unwrap();
            tx.send((rank, f(rank, mesh))).unwrap();
        });
    }
    drop(tx);
    let mut out: Vec<(usize, T)> = rx.iter().collect();
    assert_eq!(out.len(), world, "a rank thread panicked");
    out.sort_by_key(|(r, _)| *r);
    out.into_iter().map(|(_, t)| t).collect()
}

/// Values whose sum depends on the order it is taken in.
fn values(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 + rank * 104729) % 1000) as f32 * 1e-3 * 10f32.powi((i % 9) as i32 - 4)).collect()
}

const T: Duration = Duration::from_secs(20);

#[test]
fn all_reduce_sums_in_rank_order_bit_for_bit() {
    for world in [1, 2, 3, 4] {
        let n = 1001;
        let got = with_mesh(world, T, move |rank, mut m| {
            let t = Tensor::from_vec(values(rank, n), n, &Device::Cpu).unwrap();
            m.all_reduce(&t).unwrap().to_vec1::<f32>().unwrap()
        });
        let mut want = values(0, n);
        for r in 1..world {
            for (w, v) in want.iter_mut().zip(values(r, n)) {
                *w += v;
            }
        }
        for (rank, g) in got.iter().enumerate() {
            assert!(g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "world {world} rank {rank}");
        }
    }
}

#[test]
fn bf16_sums_round_like_candle_adds() {
    let n = 257;
    let got = with_mesh(3, T, move |rank, mut m| {
        let t = Tensor::from_vec(values(rank, n), n, &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
        m.all_reduce(&t).unwrap()
    });
    let t = |r| Tensor::from_vec(values(r, n), n, &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
    let want = ((t(0) + t(1)).unwrap() + t(2)).unwrap();
    for g in got {
        assert_eq!(g.dtype(), DType::BF16);
        let (a, b) = (g.to_vec1::<half::bf16>().unwrap(), want.to_vec1::<half::bf16>().unwrap());
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}

#[test]
fn reduce_scatter_and_all_gather_follow_uneven_spans() {
    let spans = vec![
        Span { len: 5, owner: 2 },
        Span { len: 0, owner: 0 },
        Span { len: 3, owner: 0 },
        Span { len: 4, owner: 2 },
        Span { len: 2, owner: 1 },
    ];
    let n = 14;
    let s = spans.clone();
    let got = with_mesh(3, T, move |rank, mut m| {
        let t = Tensor::from_vec(values(rank, n), n, &Device::Cpu).unwrap();
        let mine = m.reduce_scatter(&t, &s).unwrap();
        let all = m.all_gather(&mine, &s).unwrap();
        (mine.to_vec1::<f32>().unwrap(), all.to_vec1::<f32>().unwrap())
    });
    let sum: Vec<f32> = (0..n).map(|i| values(0, n)[i] + values(1, n)[i] + values(2, n)[i]).collect();
    assert_eq!(got[0].0, sum[5..8].to_vec());
    assert_eq!(got[1].0, sum[12..14].to_vec());
    assert_eq!(got[2].0, [&sum[0..5], &sum[8..12]].concat());
    for (_, all) in &got {
        assert_eq!(all, &sum);
    }
}

#[test]
fn host_values_come_back_in_rank_order() {
    let got = with_mesh(3, T, |rank, mut m| {
        let f = all_gather_f64(&mut m, &[rank as f64, 0.5]).unwrap();
        let same = check_same(&mut m, "step", "7");
        let differ = check_same(&mut m, "digest", if rank == 2 { "b" } else { "a" });
        (f, same, differ)
    });
    for (f, same, differ) in got {
        assert_eq!(f, vec![vec![0.0, 0.5], vec![1.0, 0.5], vec![2.0, 0.5]]);
        assert!(same.is_ok());
        let e = differ.unwrap_err().to_string();
        assert!(e.contains("rank 2 has digest b, rank 0 has a"), "{e}");
    }
}

#[test]
fn ranks_calling_different_operations_are_told_so() {
    let got = with_mesh(2, T, |rank, mut m| {
        let t = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        if rank == 0 { m.all_reduce(&t).map(|_| ()) } else { m.all_gather_bytes(b"x").map(|_| ()) }
    });
    // The first to read the other's frame names the mismatch; the other may instead see the
    // connection shut behind it.
    let errs: Vec<CollectiveError> = got.into_iter().map(|r| r.unwrap_err()).collect();
    assert!(
        errs.iter().any(|e| matches!(e, CollectiveError::Mismatch(m) if m.contains("while this rank is at"))),
        "{errs:?}"
    );
    assert!(
        errs.iter().all(|e| matches!(e, CollectiveError::Mismatch(_) | CollectiveError::PeerClosed { .. })),
        "{errs:?}"
    );
}

#[test]
fn a_rank_that_goes_away_ends_the_others_collective_at_once() {
    let started = Instant::now();
    let got = with_mesh(3, T, |rank, mut m| {
        let t = Tensor::zeros(64, DType::F32, &Device::Cpu).unwrap();
        m.all_reduce(&t).unwrap();
        if rank == 1 {
            drop(m);
            return None;
        }
        let e = m.all_reduce(&t).unwrap_err();
        // The mesh is broken for good: no later operation pretends to work.
        assert_eq!(m.all_gather_bytes(b"x").unwrap_err(), e);
        Some(e)
    });
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    for e in got.into_iter().flatten() {
        assert!(matches!(e, CollectiveError::PeerClosed { peer: 1, .. } | CollectiveError::PeerClosed { .. }), "{e}");
    }
}

#[test]
fn a_rank_that_hangs_is_a_timeout_naming_it() {
    let got = with_mesh(2, Duration::from_millis(400), |rank, mut m| {
        let t = Tensor::zeros(8, DType::F32, &Device::Cpu).unwrap();
        if rank == 1 {
            std::thread::sleep(Duration::from_millis(1500));
            return None;
        }
        Some(m.all_reduce(&t).unwrap_err())
    });
    let e = got[0].clone().unwrap();
    assert!(matches!(e, CollectiveError::Timeout { peer: 1, .. }), "{e}");
    assert!(e.to_string().contains("timeout_seconds"), "{e}");
}

#[test]
fn an_abort_wakes_a_blocked_collective_with_its_reason() {
    let listeners: Vec<TcpListener> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let abort = Arc::new(Abort::new());
    let mut ls = listeners.into_iter();
    let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
    let a2 = addrs.clone();
    let peer = std::thread::spawn(move || Mesh::connect(1, &a2, l1, T, Arc::new(Abort::new())).unwrap());
    let mut m = Mesh::connect(0, &addrs, l0, T, abort.clone()).unwrap();
    let _keep = peer.join().unwrap();
    let a = abort.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        a.trigger("rank 3 failed: out of memory");
    });
    let started = Instant::now();
    let e = m.all_gather_bytes(b"x").unwrap_err();
    assert_eq!(e, CollectiveError::Aborted { reason: "rank 3 failed: out of memory".into() });
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn even_spans_cover_the_buffer() {
    for n in [0, 1, 7, 64] {
        for w in 1..5 {
            let s = even_spans(n, w);
            assert_eq!(s.iter().map(|s| s.len).sum::<usize>(), n);
            assert!(s.iter().enumerate().all(|(i, s)| s.owner == i));
        }
    }
}
