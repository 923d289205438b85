use super::*;
use proptest::prelude::*;

fn scheduler(blocks: usize, max_num_seqs: usize, max_batched_tokens: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig { max_num_seqs, max_batched_tokens }, KvManager::new(blocks, 4, true))
}

/// Runs one step with a fixed next token for every sampled sequence.
fn step(s: &mut Scheduler, token: u32) -> Schedule {
    let plan = s.schedule();
    let sampled: Vec<(SeqId, u32)> = plan.seqs.iter().filter(|x| x.sample).map(|x| (x.seq, token)).collect();
    s.complete(&plan, &sampled);
    s.check().unwrap();
    plan
}

#[test]
fn a_long_prompt_is_chunked_beside_running_decodes() {
    let mut s = scheduler(64, 8, 16);
    s.add(1, vec![1; 6], 0);
    let first = step(&mut s, 9);
    assert_eq!(first.seqs, [Scheduled { seq: 1, start: 0, len: 6, sample: true }]);
    // A 40-token prompt arrives: each step decodes sequence 1 and prefills 15 of the prompt.
    s.add(2, vec![2; 40], 0);
    for (i, start) in [0, 15, 30].into_iter().enumerate() {
        let plan = step(&mut s, 9);
        assert_eq!(plan.seqs[0], Scheduled { seq: 1, start: 6 + i, len: 1, sample: true });
        let len = (40 - start).min(15);
        assert_eq!(plan.seqs[1], Scheduled { seq: 2, start, len, sample: start + len == 40 });
    }
    assert_eq!(s.seq(2).unwrap().tokens.len(), 41, "the prompt's last chunk sampled a token");
}

#[test]
fn a_shared_prefix_is_computed_once() {
    let mut s = scheduler(64, 8, 64);
    let system: Vec<u32> = (0..12).collect();
    s.add(1, [system.clone(), vec![100, 101]].concat(), 0);
    step(&mut s, 7);
    s.add(2, [system.clone(), vec![200]].concat(), 0);
    s.add(3, [system.clone(), vec![300]].concat(), 5);
    let plan = step(&mut s, 7);
    // Sequence 2 starts after the 12 cached tokens; 3 (another adapter) computes everything.
    assert!(plan.seqs.contains(&Scheduled { seq: 2, start: 12, len: 1, sample: true }), "{plan:?}");
    assert!(plan.seqs.contains(&Scheduled { seq: 3, start: 0, len: 13, sample: true }), "{plan:?}");
    assert_eq!(s.seq(2).unwrap().cached, 12);
}

#[test]
fn the_latest_sequence_is_preempted_and_recomputed_when_blocks_run_out() {
    // 5 blocks of 4: two sequences of 8 tokens fit; growing past that preempts the second.
    let mut s = scheduler(5, 8, 64);
    s.add(1, vec![1; 8], 0);
    s.add(2, vec![2; 8], 0);
    step(&mut s, 3); // both prefilled, 9 tokens each: 3 + 2 blocks needed on the next step
    let plan = step(&mut s, 3);
    assert_eq!(plan.preempted, [2]);
    assert_eq!(plan.seqs.iter().map(|x| x.seq).collect::<Vec<_>>(), [1]);
    assert_eq!((s.running(), s.waiting()), (1, 1));
    // Sequence 1 finishes; 2 comes back. Its prompt's two full blocks are still in the prefix
    // cache, so only the token it had generated is computed again.
    s.remove(1);
    let plan = step(&mut s, 3);
    assert_eq!(plan.seqs, [Scheduled { seq: 2, start: 8, len: 1, sample: true }]);
}

/// One step, then every sequence with 6 generated tokens ends (and leaves `live`).
fn step_and_finish(s: &mut Scheduler, live: &mut Vec<SeqId>, token: u32) {
    step(s, token);
    live.retain(|&id| {
        let st = s.seq(id).unwrap();
        let done = st.tokens.len() >= st.prompt_len + 6;
        if done {
            assert!(s.remove(id));
        }
        !done
    });
}

#[derive(Debug, Clone)]
enum Op {
    Add { prefix: usize, len: usize, adapter: u64 },
    Step,
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..3, 1usize..30, 0u64..2).prop_map(|(prefix, len, adapter)| Op::Add { prefix, len, adapter }),
        5 => Just(Op::Step),
        2 => (0usize..64).prop_map(Op::Cancel),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Random arrivals (sharing prefixes, two adapters), steps that finish sequences at a
    /// length, and cancellations of random sequences, on a pool small enough to preempt: the
    /// invariants hold after every operation, and once everything has ended every block is
    /// free again.
    #[test]
    fn no_block_leaks_after_random_requests_and_cancellations(
        ops in proptest::collection::vec(op(), 1..40),
        max_num_seqs in 1usize..5,
        budget in 4usize..24,
    ) {
        let prefixes: [Vec<u32>; 3] = [vec![], (0..8).collect(), (0..13).map(|t| t * 3).collect()];
        let mut s = scheduler(12, max_num_seqs, budget);
        let mut next: SeqId = 0;
        let mut live: Vec<SeqId> = Vec::new();
        let mut token = 1000;
        for op in ops {
            match op {
                Op::Add { prefix, len, adapter } => {
                    let prompt = [prefixes[prefix].clone(), (0..len as u32).map(|t| t + 500).collect()].concat();
                    // Requests longer than the pool could ever hold are refused before the
                    // scheduler (the engine's context check).
                    if prompt.len() + 6 <= 12 * 4 {
                        s.add(next, prompt, adapter);
                        live.push(next);
                        next += 1;
                    }
                }
                Op::Step => {
                    token += 1;
                    step_and_finish(&mut s, &mut live, token);
                }
                Op::Cancel(i) => {
                    if !live.is_empty() {
                        let id = live.remove(i % live.len());
                        prop_assert!(s.remove(id));
                    }
                }
            }
            s.check().map_err(TestCaseError::fail)?;
        }
        // Whatever is left runs to its end.
        for _ in 0..500 {
            if live.is_empty() {
                break;
            }
            token += 1;
            step_and_finish(&mut s, &mut live, token);
        }
        prop_assert!(live.is_empty(), "sequences never finished: {live:?}");
        prop_assert!(s.is_idle());
        prop_assert_eq!(s.kv().used_blocks(), 0);
        s.check().map_err(TestCaseError::fail)?;
    }
}

#[test]
fn a_step_is_planned_ahead_only_when_the_next_schedule_would_be_the_same() {
    let mut s = scheduler(6, 8, 64);
    s.add(1, vec![1; 6], 0);
    s.add(2, vec![2; 3], 0);
    let prefill = s.schedule();
    assert_eq!(s.schedule_ahead(&prefill), None, "prompts are not decodes");
    s.complete(&prefill, &[(1, 9), (2, 9)]);
    let decode = s.schedule();
    let ahead = s.schedule_ahead(&decode).expect("two decodes, nothing waiting");
    assert_eq!(ahead.seqs, decode.seqs.iter().map(|x| Scheduled { start: x.start + 1, ..*x }).collect::<Vec<_>>());
    // Room for the token after the one `decode` draws: sequence 1 reaches 8 tokens (2 blocks).
    assert_eq!(s.table(1).len(), 2);
    s.complete(&decode, &[(1, 4), (2, 4)]);
    s.complete(&ahead, &[(1, 5), (2, 5)]);
    s.check().unwrap();
    assert_eq!(s.seq(1).unwrap().tokens[6..], [9, 4, 5]);
    // What schedule() plans next is what planning ahead continues from.
    let next = s.schedule();
    assert_eq!(next.seqs, ahead.seqs.iter().map(|x| Scheduled { start: x.start + 1, ..*x }).collect::<Vec<_>>());
    // A waiting request must be admitted by schedule(): no plan ahead.
    s.add(3, vec![3; 2], 0);
    assert_eq!(s.schedule_ahead(&next), None);
    s.remove(3);
    // Nor when a sequence would need a block the pool does not have (6 blocks, 5 held).
    let grown = s.schedule_ahead(&next).expect("room for one more token each");
    s.complete(&next, &[(1, 6), (2, 6)]);
    s.complete(&grown, &[(1, 7), (2, 7)]);
    let last = s.schedule();
    assert!(s.schedule_ahead(&last).is_none() || s.kv().used_blocks() <= 6);
    // Nor for a plan whose sequence has since left.
    s.remove(2);
    assert_eq!(s.schedule_ahead(&last), None);
}
