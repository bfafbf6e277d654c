use super::*;
use proptest::prelude::*;

/// Tensors laid one after the other in `files` files from offset 4096, with sizes `sizes`
/// (tensor i in file i % files).
fn laid(sizes: &[u64], files: usize) -> Vec<GroupTensor> {
    let mut next = vec![4096u64; files.max(1)];
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let f = i % files.max(1);
            let start = next[f];
            next[f] += n;
            GroupTensor {
                file: f,
                range: start..start + n,
            }
        })
        .collect()
}

/// Every byte of every tensor carried exactly once, messages contiguous in their file and
/// within `max_message`, each rank's messages in file order.
fn check_covers(tensors: &[GroupTensor], plan: &GroupPlan, opts: PlanOptions) {
    let mut got: Vec<Vec<Range<u64>>> = vec![Vec::new(); tensors.len()];
    let mut last_end: Vec<Option<(usize, u64)>> = vec![None; plan.ranks];
    for m in &plan.messages {
        assert!(m.owner < plan.ranks);
        assert!(!m.is_empty());
        assert!(m.len() <= opts.max_message.max(CUT_ALIGN), "{m:?}");
        let mut at = m.range.start;
        for p in &m.pieces {
            let t = &tensors[p.tensor];
            assert_eq!(t.file, m.file);
            assert_eq!(
                t.range.start + p.bytes.start,
                at,
                "pieces contiguous: {m:?}"
            );
            at += p.bytes.end - p.bytes.start;
            got[p.tensor].push(p.bytes.clone());
        }
        assert_eq!(at, m.range.end);
        if let Some((f, end)) = last_end[m.owner] {
            assert!(
                (m.file, m.range.start) >= (f, end),
                "rank's reads in file order"
            );
        }
        last_end[m.owner] = Some((m.file, m.range.end));
    }
    for (i, t) in tensors.iter().enumerate() {
        let mut parts = got[i].clone();
        parts.sort_by_key(|r| r.start);
        let mut at = 0;
        for r in parts {
            assert_eq!(r.start, at, "tensor {i} covered once");
            at = r.end;
        }
        assert_eq!(at, t.range.end - t.range.start, "tensor {i} covered whole");
    }
}

#[test]
fn one_rank_reads_everything_in_file_order() {
    let tensors = laid(&[10, 0, 5 << 20, 300], 1);
    let opts = PlanOptions::for_total(10 + (5 << 20) + 300, 1);
    let plan = plan_group_read(&tensors, 1, opts);
    check_covers(&tensors, &plan, opts);
    assert!(plan.messages.iter().all(|m| m.owner == 0));
    assert!(plan
        .messages
        .iter()
        .all(|m| m.pieces.iter().all(|p| p.tensor != 1)));
}

#[test]
fn equal_tensors_are_shared_whole_and_evenly() {
    let tensors = laid(&[4 << 20; 8], 1);
    let opts = PlanOptions::for_total(32 << 20, 4);
    let plan = plan_group_read(&tensors, 4, opts);
    check_covers(&tensors, &plan, opts);
    assert_eq!(plan.bytes_per_rank(), vec![8 << 20; 4]);
    assert!(plan.messages.iter().all(|m| m.is_whole_tensor(&tensors)));
    // The first broadcasts come from different ranks: every rank reads at once.
    let first: Vec<usize> = plan.messages.iter().take(4).map(|m| m.owner).collect();
    assert_eq!(first, vec![0, 1, 2, 3]);
}

#[test]
fn one_tensor_larger_than_the_rest_is_read_by_several_ranks() {
    let tensors = laid(&[1 << 20, 64 << 20, 1 << 20], 1);
    let total = 66 << 20;
    let opts = PlanOptions::for_total(total, 4);
    let plan = plan_group_read(&tensors, 4, opts);
    check_covers(&tensors, &plan, opts);
    let per = plan.bytes_per_rank();
    let share = total / 4;
    for b in &per {
        assert!(b.abs_diff(share) <= CUT_ALIGN + opts.slack, "{per:?}");
    }
    let readers: std::collections::BTreeSet<usize> = plan
        .messages
        .iter()
        .filter(|m| m.pieces.iter().any(|p| p.tensor == 1))
        .map(|m| m.owner)
        .collect();
    assert_eq!(readers.len(), 4);
}

#[test]
fn without_split_tensors_stay_whole() {
    let tensors = laid(&[1 << 20, 64 << 20, 1 << 20], 1);
    let mut opts = PlanOptions::for_total(66 << 20, 4);
    opts.split = false;
    let plan = plan_group_read(&tensors, 4, opts);
    check_covers(&tensors, &plan, opts);
    for m in &plan.messages {
        for p in &m.pieces {
            // Every piece of a tensor has the same owner.
            let owners: std::collections::BTreeSet<usize> = plan
                .messages
                .iter()
                .filter(|x| x.pieces.iter().any(|q| q.tensor == p.tensor))
                .map(|x| x.owner)
                .collect();
            assert_eq!(owners.len(), 1);
        }
    }
}

#[test]
fn small_neighbours_share_a_message() {
    let tensors = laid(&[100; 1000], 1);
    let opts = PlanOptions::for_total(100_000, 2);
    let plan = plan_group_read(&tensors, 2, opts);
    check_covers(&tensors, &plan, opts);
    assert!(plan.messages.len() <= 4, "{} messages", plan.messages.len());
}

#[test]
fn tensors_of_several_files_never_share_a_message() {
    let tensors = laid(&[100; 10], 3);
    let opts = PlanOptions::for_total(1000, 2);
    let plan = plan_group_read(&tensors, 2, opts);
    check_covers(&tensors, &plan, opts);
    assert!(plan.messages.len() >= 3);
}

#[test]
fn more_ranks_than_bytes_leaves_some_idle() {
    let tensors = laid(&[4096], 1);
    let opts = PlanOptions::for_total(4096, 4);
    let plan = plan_group_read(&tensors, 4, opts);
    check_covers(&tensors, &plan, opts);
}

proptest! {
    #[test]
    fn plans_cover_every_byte_once_and_balance(
        sizes in proptest::collection::vec(prop_oneof![Just(0u64), 1u64..5000, 1u64..(40 << 20)], 0..40),
        files in 1usize..4,
        ranks in 1usize..6,
        split in any::<bool>(),
        max_message in prop_oneof![Just(4096u64), Just(1u64 << 20), Just(32u64 << 20)],
    ) {
        let tensors = laid(&sizes, files);
        let total: u64 = sizes.iter().sum();
        let mut opts = PlanOptions::for_total(total, ranks);
        opts.split = split;
        opts.max_message = max_message;
        let plan = plan_group_read(&tensors, ranks, opts);
        check_covers(&tensors, &plan, opts);
        prop_assert_eq!(plan.clone(), plan_group_read(&tensors, ranks, opts));
        if split {
            let share = total / ranks as u64;
            for b in plan.bytes_per_rank() {
                prop_assert!(b <= share + 2 * (opts.slack + CUT_ALIGN) + 1, "{} > {}", b, share);
            }
        }
    }
}

#[test]
fn each_share_ends_in_short_messages() {
    let tensors = laid(&[64 << 20, 64 << 20], 1);
    let opts = PlanOptions::for_total(128 << 20, 2);
    let plan = plan_group_read(&tensors, 2, opts);
    check_covers(&tensors, &plan, opts);
    for r in 0..2 {
        let last = plan.messages.iter().rev().find(|m| m.owner == r).unwrap();
        assert!(last.len() <= opts.tail, "{last:?}");
    }
}
