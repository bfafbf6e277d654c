//! The selector's answers, kept per file between transfers.
//!
//! Asking the selector costs a lock, a context key built and looked up, and a scan of the
//! candidates (see `docs/lab/measurement.md`). Its answer changes
//! only when what it knows changes, which it tells through its [`Epochs`]: a choice stands
//! while no context's choice changed (most transfers of a tuned workload), an exploration's
//! answer while nothing at all was recorded (the reads of a stream explored in runs). So a
//! file keeps the last few answers and asks again only when an epoch moved.

use fastensor_core::TransferContext;
use fastensor_select::{Epochs, KeyShape};

/// What decides the selector's answer for a transfer of a file: its context key but the
/// file's location (which does not change), and the path of the stream's last read (an
/// exploring answer depends on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Question {
    shape: KeyShape,
    stay: Option<usize>,
}

impl Question {
    /// The question of a transfer in `ctx`, continuing a stream last read through the
    /// candidate `stay`.
    pub(crate) fn of(ctx: &TransferContext, stay: Option<usize>) -> Question {
        Question {
            shape: KeyShape::of(ctx),
            stay,
        }
    }

    /// Same context key (whatever `stay` is).
    fn same_context(&self, other: &Question) -> bool {
        self.shape == other.shape
    }
}

/// One answer kept.
#[derive(Debug, Clone, Copy)]
struct Answer {
    question: Question,
    /// The candidate chosen (index among the engine's candidates).
    path: usize,
    exploring: bool,
    /// The epoch it stands on: `Epochs::choices` for a choice, `Epochs::state` for an
    /// exploration.
    epoch: u64,
}

impl Answer {
    /// Whether this answers `question` under `epochs`.
    fn answers(&self, question: &Question, epochs: Epochs) -> bool {
        if self.exploring {
            self.question == *question && self.epoch == epochs.state
        } else {
            self.question.same_context(question) && self.epoch == epochs.choices
        }
    }
}

/// How many answers a file keeps (a mixed workload's size classes and both directions).
const KEPT: usize = 8;

/// The answers a file keeps (the most recent [`KEPT`]).
#[derive(Debug, Default)]
pub(crate) struct Decisions {
    answers: [Option<Answer>; KEPT],
    /// Where the next answer goes (round robin).
    next: usize,
}

impl Decisions {
    /// The kept answer to `question` that still stands under `epochs`: the candidate and
    /// whether it is an exploration's measurement.
    pub(crate) fn get(&self, question: &Question, epochs: Epochs) -> Option<(usize, bool)> {
        self.answers
            .iter()
            .flatten()
            .find(|a| a.answers(question, epochs))
            .map(|a| (a.path, a.exploring))
    }

    /// Keeps the answer the selector just gave, `epochs` read after it answered.
    pub(crate) fn put(&mut self, question: Question, path: usize, exploring: bool, epochs: Epochs) {
        let answer = Answer {
            question,
            path,
            exploring,
            epoch: if exploring {
                epochs.state
            } else {
                epochs.choices
            },
        };
        // An older answer to the same context gives way.
        let slot = self
            .answers
            .iter()
            .position(|a| a.is_some_and(|a| a.question.same_context(&question)))
            .unwrap_or_else(|| {
                let slot = self.next;
                self.next = (self.next + 1) % KEPT;
                slot
            });
        self.answers[slot] = Some(answer);
    }

    /// Forgets every answer (the candidates offered changed).
    pub(crate) fn clear(&mut self) {
        *self = Decisions::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::test_read as read;
    use fastensor_core::CacheState;

    const E: Epochs = Epochs {
        state: 10,
        choices: 3,
    };

    #[test]
    fn a_choice_stands_until_a_choice_changes_whatever_the_stream() {
        let mut d = Decisions::default();
        let q = Question::of(&read(4096, CacheState::Cold), None);
        d.put(q, 2, false, E);
        // Same size class, another stream path, more observations: still the choice.
        let q2 = Question::of(&read(8000, CacheState::Cold), Some(1));
        assert_eq!(d.get(&q2, Epochs { state: 99, ..E }), Some((2, false)));
        // Another context, or a choice changed somewhere: ask again.
        assert_eq!(
            d.get(&Question::of(&read(4096, CacheState::Cached), None), E),
            None
        );
        assert_eq!(
            d.get(&Question::of(&read(8192, CacheState::Cold), None), E),
            None
        );
        assert_eq!(d.get(&q, Epochs { choices: 4, ..E }), None);
    }

    #[test]
    fn an_exploration_stands_only_for_the_same_stream_path_and_state() {
        let mut d = Decisions::default();
        let q = Question::of(&read(4096, CacheState::Cold), Some(1));
        d.put(q, 1, true, E);
        assert_eq!(d.get(&q, Epochs { choices: 7, ..E }), Some((1, true)));
        assert_eq!(
            d.get(&Question::of(&read(4096, CacheState::Cold), Some(0)), E),
            None
        );
        assert_eq!(d.get(&q, Epochs { state: 11, ..E }), None);
    }

    #[test]
    fn a_new_answer_replaces_the_old_one_of_its_context_and_the_oldest_goes_first() {
        let mut d = Decisions::default();
        let q = |bytes| Question::of(&read(bytes, CacheState::Cold), None);
        d.put(q(4096), 1, true, E);
        d.put(q(4096), 2, false, E);
        assert_eq!(d.get(&q(4096), E), Some((2, false)));
        assert_eq!(d.answers.iter().flatten().count(), 1);
        for i in 0..KEPT as u32 {
            d.put(q(1 << (13 + i)), 0, false, E);
        }
        // The 4 KiB answer was the oldest: gone; the others stay.
        assert_eq!(d.get(&q(4096), E), None);
        assert_eq!(d.get(&q(1 << 13), E), Some((0, false)));
        d.clear();
        assert_eq!(d.get(&q(1 << 13), E), None);
    }
}
