//! The order in which offloaded tensors are expected back, from which the store decides what
//! to prefetch next.

use std::collections::BTreeMap;

/// The expected order of `get`s.
#[derive(Debug, Default, Clone)]
pub struct Schedule {
    /// An explicit order given by [`crate::OffloadStore::hint_order`]; `None`:
    /// backward order (last in, first out).
    hint: Option<Vec<u64>>,
    /// The last tensor taken with `get` (the schedule's cursor): with a hint, where the
    /// order resumes; without one, only whether the gets have begun.
    cursor: Option<u64>,
}

impl Schedule {
    /// Sets an explicit order; the cursor moves before its first tensor.
    pub fn set_hint(&mut self, ids: Vec<u64>) {
        self.hint = Some(ids);
        self.cursor = None;
    }

    /// Back to the default backward (LIFO) order.
    pub fn clear_hint(&mut self) {
        self.hint = None;
    }

    /// Records that `id` was taken: prefetching continues after it.
    pub fn taken(&mut self, id: u64) {
        self.cursor = Some(id);
    }

    /// Forgets a tensor whose handle was dropped.
    pub fn forget(&mut self, id: u64) {
        if let Some(h) = &mut self.hint {
            h.retain(|&x| x != id);
        }
    }

    /// Up to `depth` tensors expected next, nearest first, among the `entries` (keyed by id,
    /// in put order) for which `live` holds, ending before the first for which `more`
    /// (asked of each in turn) says no: a caller bounds the list by the bytes its memory
    /// can hold, so a long schedule costs no more than the part of it that could fit. With
    /// no hint and no `get` yet, nothing is expected (the caller is still putting).
    pub fn next<V>(
        &self,
        entries: &BTreeMap<u64, V>,
        depth: usize,
        live: impl Fn(&V) -> bool,
        mut more: impl FnMut(&V) -> bool,
    ) -> Vec<u64> {
        let expected: Box<dyn Iterator<Item = (u64, &V)> + '_> = match (&self.hint, self.cursor) {
            (Some(order), cursor) => {
                let start = cursor
                    .and_then(|c| order.iter().position(|&x| x == c))
                    .map_or(0, |p| p + 1);
                Box::new(
                    order[start..]
                        .iter()
                        .filter_map(|&id| entries.get(&id).map(|v| (id, v))),
                )
            }
            // Backward order: the last put of those still expected comes first, wherever
            // the cursor is (backward does not take tensors in exactly the reverse order
            // they were put: a tensor passed over stays expected, and comes first).
            (None, Some(_)) => Box::new(entries.iter().rev().map(|(&id, v)| (id, v))),
            (None, None) => return Vec::new(),
        };
        expected
            .filter(|(_, v)| live(v))
            .take(depth)
            .take_while(|(_, v)| more(v))
            .map(|(id, _)| id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifo_and_hint() {
        // Tensors 0..10, of which 9 and 7 are taken (false: no longer expected).
        let live: BTreeMap<u64, bool> = (0..10).map(|i| (i, i != 9 && i != 7)).collect();
        let mut s = Schedule::default();
        assert!(s.next(&live, 3, |&v| v, |_| true).is_empty());
        s.taken(7);
        // 8 was passed over: it is expected first.
        assert_eq!(s.next(&live, 3, |&v| v, |_| true), vec![8, 6, 5]);
        let live: BTreeMap<u64, ()> = (0..10).map(|i| (i, ())).collect();
        s.set_hint(vec![1, 3, 5, 20, 7]);
        assert_eq!(s.next(&live, 2, |_| true, |_| true), vec![1, 3]);
        s.taken(5);
        assert_eq!(s.next(&live, 5, |_| true, |_| true), vec![7]);
        // Bounded by the caller: the list ends before the first it refuses.
        let room_for_two = || {
            let mut room = 2;
            move |_: &()| {
                room -= 1;
                room >= 0
            }
        };
        let bounded = s.next(&live, 5, |_| true, room_for_two());
        assert_eq!(bounded, vec![7]);
        s.clear_hint();
        let bounded = s.next(&live, 5, |_| true, room_for_two());
        assert_eq!(bounded, vec![9, 8]);
    }
}
