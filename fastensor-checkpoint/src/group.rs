//! Who reads what when the ranks of a process group load one checkpoint together: a pure,
//! deterministic plan from the tensors' places in the source's files and the group's size,
//! the same on every rank (each computes it from the same headers).
//!
//! The data of all tensors, file by file in file order, is cut into one contiguous span per
//! rank of (nearly) equal bytes, so that each rank reads one sequential stretch. A cut falls
//! on a tensor boundary when one lies within [`PlanOptions::slack`] of the even cut, else
//! (when [`PlanOptions::split`] allows it) inside the tensor, 4096-aligned in the file: one
//! tensor larger than all the others together is read by several ranks. Each span becomes
//! **messages**, the units one rank reads and then broadcasts: a piece of a tensor of at most
//! [`PlanOptions::max_message`] bytes, or several small whole tensors next to each other in
//! one file (at most `max_message` in all), so that thousands of small tensors do not cost a
//! collective each; each rank's last message is cut shorter still ([`PlanOptions::tail`]),
//! so that little is left to broadcast once the reads end. Messages go out in the order in which their owners have them read when
//! every rank reads at the same speed (by the bytes read before each message's end, then by
//! rank), so the first broadcasts start once the first message of rank 0 is read and the
//! others' reads go on meanwhile. Empty tensors have no bytes and take no message.
//!
//! Linear in the number of tensors plus messages; no I/O.

use std::ops::Range;

/// One tensor's place: the index of its file among the source's files and its absolute
/// byte range there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupTensor {
    /// The file's index among the source's files.
    pub file: usize,
    /// The tensor's bytes in that file.
    pub range: Range<u64>,
}

/// What a plan may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    /// Whether a tensor may be cut between ranks (false when each tensor must be read whole,
    /// e.g. to check its checksum).
    pub split: bool,
    /// Largest message in bytes; a larger tensor (piece) goes out in several messages.
    pub max_message: u64,
    /// Tensors smaller than this that lie next to each other in one file share a message.
    pub coalesce_below: u64,
    /// How far (in bytes) a cut may move from the even cut to fall on a tensor boundary.
    pub slack: u64,
    /// Each rank's last message, when one piece longer than this, is cut into messages of
    /// at most this many bytes: what is broadcast after the last read ends is short.
    pub tail: u64,
}

impl PlanOptions {
    /// The defaults for `total` bytes over `ranks` ranks: 16 MiB messages, 4 MiB at the
    /// end of each rank's share, tensors below 1 MiB coalesced, a cut moved by at most an
    /// eighth of a rank's share.
    pub fn for_total(total: u64, ranks: usize) -> Self {
        PlanOptions {
            split: true,
            max_message: 16 << 20,
            coalesce_below: 1 << 20,
            slack: total / (ranks.max(1) as u64 * 8),
            tail: 4 << 20,
        }
    }
}

/// Part of one tensor carried by a message: bytes `bytes` (relative to the tensor's start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// The tensor's index in the plan's input.
    pub tensor: usize,
    /// The bytes of the tensor carried, relative to its first byte.
    pub bytes: Range<u64>,
}

/// One unit read by one rank and then broadcast to the others: pieces that lie one after the
/// other in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The rank that reads it (a rank of the group, `0..ranks`).
    pub owner: usize,
    /// The file its bytes come from.
    pub file: usize,
    /// Its bytes in that file (contiguous).
    pub range: Range<u64>,
    /// The pieces, in file order; their lengths add up to the range's.
    pub pieces: Vec<Piece>,
}

impl Message {
    /// Bytes carried.
    pub fn len(&self) -> u64 {
        self.range.end - self.range.start
    }

    /// Whether it carries no bytes (never true of a planned message).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether it is exactly one whole tensor of `tensors`.
    pub fn is_whole_tensor(&self, tensors: &[GroupTensor]) -> bool {
        match self.pieces.as_slice() {
            [p] => {
                let t = &tensors[p.tensor].range;
                p.bytes.start == 0 && p.bytes.end == t.end - t.start
            }
            _ => false,
        }
    }
}

/// A group load's plan: every message, in broadcast order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    /// The ranks planned for.
    pub ranks: usize,
    /// Every message, in the order every rank takes part in its broadcast.
    pub messages: Vec<Message>,
}

impl GroupPlan {
    /// Bytes each rank reads.
    pub fn bytes_per_rank(&self) -> Vec<u64> {
        let mut out = vec![0; self.ranks];
        for m in &self.messages {
            out[m.owner] += m.len();
        }
        out
    }
}

/// Alignment of a cut inside a tensor (file offset), for direct reads.
const CUT_ALIGN: u64 = 4096;

/// The plan of reading `tensors` by `ranks` ranks (see the module's documentation).
/// `ranks` of 0 is taken as 1.
pub fn plan_group_read(tensors: &[GroupTensor], ranks: usize, opts: PlanOptions) -> GroupPlan {
    let ranks = ranks.max(1);
    let max_message = opts.max_message.max(CUT_ALIGN);
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].range.end > tensors[i].range.start)
        .collect();
    order.sort_by_key(|&i| (tensors[i].file, tensors[i].range.start, i));
    let total: u64 = order.iter().map(|&i| len_of(&tensors[i])).sum();

    // Each rank's stretch of the stream of all bytes: [cuts[r], cuts[r + 1]).
    let cuts = cut_points(tensors, &order, total, ranks, opts);

    // Walk the stream once, emitting each rank's messages.
    let mut per_rank: Vec<Vec<Message>> = vec![Vec::new(); ranks];
    let mut pos = 0u64; // stream position of the current tensor's first byte
    for &i in &order {
        let t = &tensors[i];
        let n = len_of(t);
        let mut at = 0u64; // within the tensor
        while at < n {
            let stream = pos + at;
            let owner = owner_at(&cuts, stream);
            let until = (cuts[owner + 1] - pos).min(n);
            let take = until - at;
            let piece = Piece {
                tensor: i,
                bytes: at..until,
            };
            push_piece(
                &mut per_rank[owner],
                owner,
                t,
                piece,
                take,
                n,
                opts,
                max_message,
            );
            at = until;
        }
        pos += n;
    }
    for msgs in &mut per_rank {
        taper(msgs, opts.tail.max(CUT_ALIGN));
    }
    GroupPlan {
        ranks,
        messages: interleave(per_rank),
    }
}

fn len_of(t: &GroupTensor) -> u64 {
    t.range.end - t.range.start
}

/// The stream positions where each rank's stretch starts, and the total at the end
/// (`ranks + 1` values, non-decreasing).
fn cut_points(
    tensors: &[GroupTensor],
    order: &[usize],
    total: u64,
    ranks: usize,
    opts: PlanOptions,
) -> Vec<u64> {
    // Tensor boundaries in the stream (0 and total included).
    let mut bounds = Vec::with_capacity(order.len() + 1);
    let mut pos = 0u64;
    bounds.push(0);
    for &i in order {
        pos += len_of(&tensors[i]);
        bounds.push(pos);
    }
    let mut cuts = Vec::with_capacity(ranks + 1);
    cuts.push(0u64);
    for r in 1..ranks {
        let even = (total as u128 * r as u128 / ranks as u128) as u64;
        let prev = *cuts.last().unwrap();
        // The nearest tensor boundary to the even cut.
        let k = bounds.partition_point(|&b| b < even);
        let mut best = None::<u64>;
        for &b in [k.checked_sub(1).map(|k| bounds[k]), bounds.get(k).copied()]
            .iter()
            .flatten()
        {
            let closer = best.is_none_or(|x| b.abs_diff(even) < x.abs_diff(even));
            if b >= prev && closer {
                best = Some(b);
            }
        }
        let cut = match best {
            Some(b) if !opts.split || b.abs_diff(even) <= opts.slack => b,
            _ if opts.split => aligned_cut(tensors, order, &bounds, even).max(prev),
            _ => prev,
        };
        cuts.push(cut.min(total));
    }
    cuts.push(total);
    cuts
}

/// A cut near stream position `even`, inside the tensor holding it, moved down to a
/// 4096-aligned file offset of that tensor where one lies inside it.
fn aligned_cut(tensors: &[GroupTensor], order: &[usize], bounds: &[u64], even: u64) -> u64 {
    let k = bounds.partition_point(|&b| b <= even).saturating_sub(1);
    let Some(&i) = order.get(k) else {
        return even;
    };
    let start = bounds[k];
    let file_at = tensors[i].range.start + (even - start);
    let aligned = file_at - file_at % CUT_ALIGN;
    if aligned > tensors[i].range.start {
        start + (aligned - tensors[i].range.start)
    } else {
        even
    }
}

/// The rank whose stretch holds stream position `pos`.
fn owner_at(cuts: &[u64], pos: u64) -> usize {
    // The last r with cuts[r] <= pos (stretches may be empty: skip them).
    cuts.partition_point(|&c| c <= pos).saturating_sub(1)
}

/// Adds `piece` (of tensor `t`, `take` bytes, the tensor `n` bytes long) to `msgs`, the
/// messages of `owner`: joined to the last message when both are small whole tensors next
/// to each other in one file and the sum stays within `max_message`; a long piece is cut
/// into messages of at most `max_message`.
#[allow(clippy::too_many_arguments)]
fn push_piece(
    msgs: &mut Vec<Message>,
    owner: usize,
    t: &GroupTensor,
    piece: Piece,
    take: u64,
    n: u64,
    opts: PlanOptions,
    max_message: u64,
) {
    let file_start = t.range.start + piece.bytes.start;
    let small_whole = take == n && n < opts.coalesce_below;
    if small_whole {
        if let Some(last) = msgs.last_mut() {
            let joinable = last.file == t.file
                && last.range.end == file_start
                && last.len() + take <= max_message
                && last
                    .pieces
                    .iter()
                    .all(|p| p.bytes.start == 0 && p.bytes.end < opts.coalesce_below);
            if joinable {
                last.range.end += take;
                last.pieces.push(piece);
                return;
            }
        }
    }
    let mut at = piece.bytes.start;
    while at < piece.bytes.end {
        let end = (at + max_message).min(piece.bytes.end);
        let start_in_file = t.range.start + at;
        msgs.push(Message {
            owner,
            file: t.file,
            range: start_in_file..t.range.start + end,
            pieces: vec![Piece {
                tensor: piece.tensor,
                bytes: at..end,
            }],
        });
        at = end;
    }
}

/// Cuts the last of `msgs` into messages of at most `tail` bytes when it is one piece of a
/// tensor longer than that.
fn taper(msgs: &mut Vec<Message>, tail: u64) {
    let Some(last) = msgs.last() else {
        return;
    };
    if last.pieces.len() != 1 || last.len() <= tail {
        return;
    }
    let last = msgs.pop().expect("checked");
    let p = &last.pieces[0];
    let mut at = p.bytes.start;
    while at < p.bytes.end {
        let end = (at + tail).min(p.bytes.end);
        let file_at = last.range.start + (at - p.bytes.start);
        msgs.push(Message {
            owner: last.owner,
            file: last.file,
            range: file_at..file_at + (end - at),
            pieces: vec![Piece {
                tensor: p.tensor,
                bytes: at..end,
            }],
        });
        at = end;
    }
}

/// Every rank's messages merged into broadcast order: by the bytes their owner has read
/// once each is read (reads going on at the same speed on every rank), ties by rank.
fn interleave(per_rank: Vec<Vec<Message>>) -> Vec<Message> {
    let mut keyed = Vec::new();
    for msgs in per_rank {
        let mut done = 0u64;
        for m in msgs {
            done += m.len();
            keyed.push((done, m.owner, m));
        }
    }
    // Stable: a rank's own messages stay in its read order.
    keyed.sort_by_key(|(done, owner, _)| (*done, *owner));
    keyed.into_iter().map(|(_, _, m)| m).collect()
}

#[cfg(test)]
mod tests;
