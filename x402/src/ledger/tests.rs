use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::*;

fn key(i: u8) -> AuthKey {
    (Address::repeat_byte(0xA5), Address::repeat_byte(i + 1), B256::repeat_byte(i))
}

fn intent(i: u8, resource: &str) -> Intent {
    Intent {
        facts: PaymentFacts { resource: resource.into(), ..PaymentFacts::default() },
        pay_to: Address::repeat_byte(0xEE),
        value: 10,
        valid_before: 1_000,
        fingerprint: B256::repeat_byte(i.wrapping_add(100)),
    }
}

fn fresh(claim: Claim) -> Ticket {
    match claim {
        Claim::Fresh(t) => t,
        Claim::Redeem(..) => panic!("expected a fresh claim, got a redemption"),
        Claim::Refused(r) => panic!("expected a fresh claim, refused: {r}"),
    }
}

fn refusal(claim: Claim) -> RejectReason {
    match claim {
        Claim::Refused(r) => r,
        _ => panic!("expected a refusal"),
    }
}

const LANDED: Landed = Landed { tx: B256::repeat_byte(7), block: 3 };

#[test]
fn one_claim_at_a_time_whatever_the_route() {
    let l = Ledger::new();
    let fp = intent(1, "/a").fingerprint;
    let t = fresh(l.claim(key(1), fp, "/a", 0));
    assert_eq!(refusal(l.claim(key(1), fp, "/b", 0)), RejectReason::NonceInFlight, "another route");
    assert_eq!(refusal(l.claim(key(1), fp, "/a", 0)), RejectReason::NonceInFlight, "the same route");
    drop(t);
    let _t = fresh(l.claim(key(1), fp, "/b", 0));
}

#[test]
fn a_served_authorization_is_refused_everywhere_and_a_settled_one_redeems_once_on_its_route() {
    let l = Ledger::new();
    let i = intent(1, "/a");
    let mut t = fresh(l.claim(key(1), i.fingerprint, "/a", 0));
    t.settling(i.clone());
    assert_eq!(refusal(l.claim(key(1), i.fingerprint, "/a", 0)), RejectReason::NonceInFlight, "while it settles");
    t.settled(LANDED);
    drop(t); // the answer never left
    assert_eq!(
        refusal(l.claim(key(1), i.fingerprint, "/b", 0)),
        RejectReason::NonceAlreadyUsed,
        "redeemable on its own route only"
    );
    assert_eq!(
        refusal(l.claim(key(1), B256::ZERO, "/a", 0)),
        RejectReason::NonceAlreadyUsed,
        "only by the very same signed authorization"
    );
    let Claim::Redeem(t, landed) = l.claim(key(1), i.fingerprint, "/a", 0) else { panic!("redeem") };
    assert_eq!(landed, LANDED);
    assert_eq!(refusal(l.claim(key(1), i.fingerprint, "/a", 0)), RejectReason::NonceInFlight, "being redeemed");
    t.served();
    for route in ["/a", "/b"] {
        assert_eq!(refusal(l.claim(key(1), i.fingerprint, route, 0)), RejectReason::NonceAlreadyUsed);
    }
}

#[test]
fn redemptions_are_bounded() {
    let l = Ledger::new();
    let i = intent(1, "/a");
    let mut t = fresh(l.claim(key(1), i.fingerprint, "/a", 0));
    t.settling(i.clone());
    t.settled(LANDED);
    drop(t);
    for _ in 0..MAX_REDEMPTIONS {
        let Claim::Redeem(t, _) = l.claim(key(1), i.fingerprint, "/a", 0) else { panic!("redeem") };
        drop(t);
    }
    assert_eq!(refusal(l.claim(key(1), i.fingerprint, "/a", 0)), RejectReason::NonceAlreadyUsed);
}

#[test]
fn a_restart_remembers_intents_settlements_and_deliveries() {
    let (a, b, c) = (intent(1, "/a"), intent(2, "/a"), intent(3, "/a"));
    let records = vec![
        Record::Settling(key(1), a.clone()),
        Record::Settling(key(2), b.clone()),
        Record::Settled(key(2), LANDED),
        Record::Settling(key(3), c.clone()),
        Record::Settled(key(3), LANDED),
        Record::Served(key(3)),
        Record::Settling(key(4), intent(4, "/a")),
        Record::Failed(key(4)),
    ];
    let l = Ledger::new();
    l.restore(records, 0);
    assert_eq!(l.pending(), vec![(key(1), a.clone())]);
    assert!(matches!(l.claim(key(2), b.fingerprint, "/a", 0), Claim::Redeem(_, LANDED)));
    assert_eq!(refusal(l.claim(key(3), c.fingerprint, "/a", 0)), RejectReason::NonceAlreadyUsed);
    drop(fresh(l.claim(key(4), intent(4, "/a").fingerprint, "/a", 0)));
    // A pending one is taken by reconciliation, or over by a retry, never both.
    let r = l.reconciling(&key(1)).expect("pending");
    assert!(l.reconciling(&key(1)).is_none());
    assert_eq!(refusal(l.claim(key(1), a.fingerprint, "/a", 0)), RejectReason::NonceInFlight);
    r.unknown();
    let retry = fresh(l.claim(key(1), a.fingerprint, "/a", 0));
    assert!(l.reconciling(&key(1)).is_none(), "a request holds it");
    drop(retry);
    assert_eq!(l.pending(), vec![(key(1), a)], "the retry gave up: still pending");
}

#[test]
fn expired_memories_are_pruned() {
    let l = Ledger::new();
    let mut i = intent(0, "/a");
    i.valid_before = 10;
    for n in 0..2000u16 {
        let k = (Address::ZERO, Address::ZERO, B256::left_padding_from(&n.to_be_bytes()));
        let mut t = fresh(l.claim(k, i.fingerprint, "/a", 11));
        t.settling(i.clone());
        t.settled(LANDED);
        t.served();
    }
    let [_, _, _, served] = l.counts();
    assert!(served < 1024, "served and expired: forgotten as the map grows ({served} kept)");
}

// ------------------------------------------------------------------ random interleavings

/// One step of the simulated world.
#[derive(Debug, Clone)]
enum Op {
    /// A client sends a request with authorization `k`.
    Start(u8),
    /// The `i`-th request in progress takes its next step.
    Advance(usize),
    /// The `i`-th request in progress is abandoned (client gone, handler failed).
    Abandon(usize),
    /// A block is mined: every broadcast settlement lands.
    Mine,
    /// Authorization `k` expires: it can no longer land.
    Expire(u8),
    /// kill -9: requests in progress vanish without a trace; the ledger is rebuilt from the log.
    Crash,
    /// One reconciliation pass.
    Reconcile,
}

fn op(keys: u8) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..keys).prop_map(Op::Start),
        6 => (0..8usize).prop_map(Op::Advance),
        1 => (0..8usize).prop_map(Op::Abandon),
        2 => Just(Op::Mine),
        1 => (0..keys).prop_map(Op::Expire),
        1 => Just(Op::Crash),
        2 => Just(Op::Reconcile),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Claimed,
    Settling,
    Delivering,
}

struct Request {
    k: u8,
    ticket: Ticket,
    step: Step,
}

/// The chain, the durable log and the clients' view, around one ledger.
#[derive(Default)]
struct World {
    ledger: Arc<Ledger>,
    log: Vec<Record>,
    requests: Vec<Request>,
    /// Mined transfers by authorization (the chain allows one per authorization).
    chain: HashMap<u8, Landed>,
    mempool: HashSet<u8>,
    expired: HashSet<u8>,
    delivered: HashMap<u8, u32>,
    redeemed_since_restart: HashMap<u8, u32>,
    txs: u8,
}

impl World {
    fn apply(&mut self, op: Op) {
        match op {
            Op::Start(k) => self.start(k),
            Op::Advance(i) if i < self.requests.len() => self.advance(i),
            Op::Abandon(i) if i < self.requests.len() => drop(self.requests.remove(i)),
            Op::Mine => {
                for k in std::mem::take(&mut self.mempool) {
                    if !self.chain.contains_key(&k) && !self.expired.contains(&k) {
                        self.txs += 1;
                        self.chain.insert(k, Landed { tx: B256::repeat_byte(self.txs), block: u64::from(self.txs) });
                    }
                }
            }
            Op::Expire(k) => {
                self.expired.insert(k);
                self.mempool.remove(&k);
            }
            Op::Crash => {
                std::mem::forget(std::mem::take(&mut self.requests));
                self.ledger = Ledger::new();
                self.ledger.restore(self.log.clone(), 0);
                self.redeemed_since_restart.clear();
            }
            Op::Reconcile => self.reconcile(),
            _ => {}
        }
    }

    fn start(&mut self, k: u8) {
        match self.ledger.claim(key(k), intent(k, "/r").fingerprint, "/r", 0) {
            Claim::Fresh(ticket) => self.requests.push(Request { k, ticket, step: Step::Claimed }),
            Claim::Redeem(ticket, landed) => {
                assert_eq!(self.chain.get(&k), Some(&landed), "a redemption names the transfer that landed");
                *self.redeemed_since_restart.entry(k).or_default() += 1;
                self.requests.push(Request { k, ticket, step: Step::Delivering });
            }
            Claim::Refused(_) => {}
        }
    }

    fn advance(&mut self, i: usize) {
        let k = self.requests[i].k;
        match self.requests[i].step {
            // A request that took over an unknown outcome looks on chain first.
            Step::Claimed if self.requests[i].ticket.takes_over() && self.chain.contains_key(&k) => {
                let landed = self.chain[&k];
                self.log.push(Record::Settled(key(k), landed));
                self.requests[i].ticket.settled(landed);
                self.requests[i].step = Step::Delivering;
            }
            // Verify: the chain refuses a used or expired authorization.
            Step::Claimed if self.chain.contains_key(&k) || self.expired.contains(&k) => {
                drop(self.requests.remove(i));
            }
            Step::Claimed => {
                self.log.push(Record::Settling(key(k), intent(k, "/r")));
                self.requests[i].ticket.settling(intent(k, "/r"));
                self.mempool.insert(k);
                self.requests[i].step = Step::Settling;
            }
            Step::Settling => match self.chain.get(&k) {
                // Our transfer, or the earlier attempt's (found on chain when ours reverts).
                Some(&landed) => {
                    self.log.push(Record::Settled(key(k), landed));
                    self.requests[i].ticket.settled(landed);
                    self.requests[i].step = Step::Delivering;
                }
                None if self.expired.contains(&k) => {
                    self.log.push(Record::Failed(key(k)));
                    self.requests.remove(i).ticket.failed();
                }
                None => {} // still waiting for a block
            },
            Step::Delivering => {
                assert!(self.chain.contains_key(&k), "an answer delivered without a transfer");
                *self.delivered.entry(k).or_default() += 1;
                self.log.push(Record::Served(key(k)));
                self.requests.remove(i).ticket.served();
            }
        }
    }

    fn reconcile(&mut self) {
        for (k, _) in self.ledger.pending() {
            let Some(ticket) = self.ledger.reconciling(&k) else { continue };
            let n = k.2.0[0];
            match self.chain.get(&n) {
                Some(&landed) => {
                    self.log.push(Record::Settled(k, landed));
                    let mut ticket = ticket;
                    ticket.settled(landed);
                }
                None if self.expired.contains(&n) => {
                    self.log.push(Record::Failed(k));
                    ticket.failed();
                }
                None => ticket.unknown(),
            }
        }
    }

    /// The accounting: answers delivered ≤ 1 per transfer and none without one; one
    /// `Settled` record per transfer, naming it; every settled tx distinct.
    fn check(&self) {
        let mut settled: HashMap<AuthKey, Vec<Landed>> = HashMap::new();
        for r in &self.log {
            if let Record::Settled(k, l) = r {
                settled.entry(*k).or_default().push(*l);
            }
        }
        for (k, n) in &self.delivered {
            assert!(*n <= 1, "authorization {k} bought {n} answers");
            assert!(self.chain.contains_key(k), "answer without a transfer");
        }
        for (k, landed) in &settled {
            let n = k.2.0[0];
            assert_eq!(landed.len(), 1, "{} settled events for one transfer", landed.len());
            assert_eq!(self.chain.get(&n), Some(&landed[0]), "a settled event names a transfer that did not happen");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn every_interleaving_keeps_the_accounts(ops in proptest::collection::vec(op(4), 1..80)) {
        let mut w = World::default();
        for op in ops {
            w.apply(op);
            w.check();
        }
        // Let everything finish: requests in flight run out, blocks are mined, the node
        // restarts and reconciles, and each payer retries until it is answered or refused.
        while !w.requests.is_empty() {
            for i in (0..w.requests.len()).rev() {
                w.advance(i);
            }
            w.apply(Op::Mine);
        }
        w.apply(Op::Crash);
        w.apply(Op::Mine);
        w.apply(Op::Reconcile);
        w.check();
        for k in 0..4u8 {
            for _ in 0..4 {
                w.start(k);
                while let Some(i) = w.requests.iter().position(|r| r.k == k) {
                    w.advance(i);
                    w.apply(Op::Mine);
                }
            }
            if let Some(landed) = w.chain.get(&k) {
                let answered = w.delivered.get(&k).copied().unwrap_or(0);
                let spent = w.redeemed_since_restart.get(&k).copied().unwrap_or(0) >= MAX_REDEMPTIONS;
                prop_assert!(answered == 1 || spent, "transfer {landed:?} of {k} bought no answer");
                let settled = w.log.iter().filter(|r| matches!(r, Record::Settled(x, _) if *x == key(k))).count();
                prop_assert_eq!(settled, 1, "every transfer is on record exactly once");
            }
        }
        w.check();
    }
}
