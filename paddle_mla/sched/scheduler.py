"""Continuous-batching scheduler with a per-step token budget, prefix caching and preemption.

Each step: running requests first (decodes, then continuing prefill chunks), then waiting ones in
arrival order. With chunked prefill a prompt may take several steps; without it a prompt runs
whole. When blocks run out the lowest-priority running request is preempted: its blocks are freed
and it is recomputed later (prompt + the tokens it already produced), so its output is unchanged.
A request fails only when it cannot fit even alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.sched.seq_blocks import SeqBlocks, UniformSeqBlocks
from paddle_mla.config.schema import SchedulerConfig
from paddle_mla.sched.output import NewRequest, ScheduledRow, StepInput
from paddle_mla.sched.request import PENDING, Sequence, Status, token_slice


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new: int          # tokens computed this step
    num_cached: int       # tokens already in the KV cache before this step
    is_prefill: bool
    samples: bool         # every known token is computed after this step: sample the next one


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    failed: list[Sequence] = field(default_factory=list)
    num_preempted: int = 0
    launched: bool = False   # overlapped scheduling: on_launch counted its tokens already

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new for s in self.scheduled)


@dataclass
class StepUpdate:
    """What ``Scheduler.update_from_output`` did with a step's sampled tokens."""

    sampled_rows: list[int] = field(default_factory=list)   # rows of ``scheduled`` that got a token
    finished: list[Sequence] = field(default_factory=list)  # by a stop id or by length, in row order
    # rows whose stop strings the output processor checks at this token: past min_tokens, not
    # stopped by a stop id; still running, or finished by length (a stop string then wins)
    stop_string_rows: list[tuple[Sequence, int]] = field(default_factory=list)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, pool: BlockPool | SeqBlocks, max_model_len: int,
                 absorbed_max_new: int = 0, prompt_apart: bool = False):
        """``pool``: a BlockPool (one block table per sequence, shared by all KV heads) or a
        head-wise pool (cache/head_pool.py); the scheduler sees either through SeqBlocks.
        ``absorbed_max_new``: extend rows of at most this many new tokens run absorbed (from the
        attention backend; 0: none): their cost counts against max_num_batched_absorbed_context.
        ``prompt_apart``: the backend computes prompt and output tokens on different paths (``triton_mla``
        under the mode): no row crosses its prompt's end, and rows of output tokens come first."""
        self.cfg = cfg
        self.prompt_apart = prompt_apart
        self.pool = pool
        self.kv: SeqBlocks = UniformSeqBlocks(pool) if isinstance(pool, BlockPool) else pool
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.cached_prompt_tokens = 0   # prefix-cache hits at first admission (recomputes not counted)
        # the last failed admission's (waiting head, pool version, budget, prefills' reserve): while all
        # four stay it fails again (SeqBlocks.version), so a blocked step skips match_prefix/release
        self._blocked: tuple | None = None
        # one block table per sequence: a decode that stays inside its last block needs no call
        # into the pool (the steady step's common row)
        self._uniform_block_size = pool.block_size if isinstance(pool, BlockPool) else 0
        self.absorbed_max_new = absorbed_max_new
        self._num_ids = 0            # sequences given an id (Sequence.seq_id)
        self._gone: list[int] = []   # ids the runner holds and must drop (StepInput.gone)

    def _absorbed_cost(self, seq: Sequence, n: int, num_cached: int) -> int:
        """New tokens x context tokens of an extend row that the backend runs absorbed (under
        ``prompt_apart``: rows of output tokens), else 0."""
        absorbed = num_cached >= seq.prompt_len if self.prompt_apart else n <= self.absorbed_max_new
        return n * (num_cached + n) if self.cfg.max_num_batched_absorbed_context and absorbed else 0

    def add(self, *seqs: Sequence, front: bool = False) -> None:
        """Queue ``seqs`` in order, behind the waiting ones or (``front``) ahead of them."""
        for seq in seqs:
            if seq.seq_id < 0:
                seq.seq_id, self._num_ids = self._num_ids, self._num_ids + 1
        if front:
            self.waiting.extendleft(reversed(seqs))
        else:
            self.waiting.extend(seqs)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _release(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks; the runner drops its copy at the next step."""
        self.kv.free(seq)
        if seq.in_runner:
            seq.in_runner = False
            seq.sent_blocks = seq.sent_swa = 0
            self._gone.append(seq.seq_id)

    def _fail(self, seq: Sequence, message: str) -> None:
        self._release(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = "error"
        seq.error = message

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _grow(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        """Give ``seq`` blocks for ``num_tokens`` tokens, preempting lower-priority requests.
        Returns False when ``seq`` itself was preempted or failed."""
        while not self.kv.can_hold(seq, num_tokens):
            victim = self.running[-1]
            if victim is seq:
                if len(self.running) == 1 and not any(s.seq is not seq for s in out.scheduled):
                    self.running.remove(seq)
                    self._fail(seq, self.kv.grow_problem(num_tokens))
                    out.failed.append(seq)
                else:
                    self._preempt(seq)
                    out.num_preempted += 1
                return False
            self._preempt(victim)
            out.num_preempted += 1
            out.scheduled = [s for s in out.scheduled if s.seq is not victim]
        self.kv.hold(seq, num_tokens)
        return True

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.cfg.max_num_batched_tokens
        chunked = self.cfg.enable_chunked_prefill
        # Decodes first, then continuing prefill chunks, each in admission order (a stable
        # partition: O(batch)). A sequence preempted earlier in this loop (a victim is taken from
        # the tail) has left RUNNING: status, not list membership (that was O(batch^2)).
        running = Status.RUNNING
        bs = self._uniform_block_size
        absorbed_cap, absorbed = self.cfg.max_num_batched_absorbed_context, 0
        chunks = []
        entry = ScheduledSeq
        for seq in self.running[:]:
            c = seq.num_computed_tokens
            toks = seq.output_token_ids
            need = len(seq.request.prompt_token_ids) + len(toks) - c
            if need > 1:
                chunks.append((seq, need))
                continue
            if budget <= 0:
                break
            if seq.status is not running:
                continue
            # a decode inside its last block (uniform tables) holds its blocks already: no _grow
            if not (bs and c < len(seq.block_ids) * bs) and not self._grow(seq, c + need, out):
                continue
            # (_grow may rebind out.scheduled: no bound append) one new token: a prefill only before any output
            out.scheduled.append(entry(seq, need, c, not toks, True))
            budget -= need
        for seq, need in chunks:
            if budget <= 0:
                break
            if seq.status is not running:
                continue
            n = self._cut(seq, seq.num_computed_tokens, min(need, budget) if chunked else need)
            if n > budget:
                continue
            cost = self._absorbed_cost(seq, n, seq.num_computed_tokens)
            if cost and absorbed and absorbed + cost > absorbed_cap:
                continue
            if not self._grow(seq, seq.num_computed_tokens + n, out):
                continue
            out.scheduled.append(self._entry(seq, n, need))
            budget -= n
            absorbed += cost
        if out.num_preempted:
            return self._ordered(out)   # do not admit new work in a step that had to preempt
        reserved = None     # blocks per pool that the running prefills still take (_reserved)
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            key = (seq, self.kv.version, budget, tuple(self._reserved(chunks)) if self.running else ())
            if self._blocked == key:
                break
            tokens = seq.token_ids()
            problem = self.kv.prompt_problem(len(tokens))
            if problem:
                self.waiting.popleft()
                self._fail(seq, problem)
                out.failed.append(seq)
                continue
            num_cached = self.kv.match_prefix(seq, tokens)
            need = len(tokens) - num_cached
            n = self._cut(seq, num_cached, min(need, budget) if chunked else need)
            if n > budget or not self.kv.can_hold(seq, num_cached + n):
                if n <= budget and not self.running and not out.scheduled:
                    # every pool is free but for this request's hit: it can never fit (head-wise
                    # pools: prompt_problem cannot bound an SWA head's first chunk up front)
                    self.waiting.popleft()
                    self._fail(seq, self.kv.grow_problem(num_cached + n))
                    out.failed.append(seq)
                    continue
                self.kv.give_up(seq, len(tokens))
                self._blocked = key
                break
            cost = self._absorbed_cost(seq, n, num_cached)
            if cost and absorbed and absorbed + cost > absorbed_cap:
                self.kv.give_up(seq, len(tokens))   # next step (the cap is per step: not "blocked")
                break
            if self.running:
                if reserved is None:     # the memo key's, computed this iteration from the same state
                    reserved = list(key[3])
                if not self._fits_with(reserved, self.kv.prompt_need(seq, len(tokens) + 1, self._chunk(len(tokens)))):
                    self.kv.give_up(seq, len(tokens))
                    self._blocked = key
                    break
            self.waiting.popleft()
            self.kv.hold(seq, num_cached + n)
            chunks.append((seq, need))
            if reserved is not None:
                reserved = [r + x for r, x in zip(reserved, self.kv.prompt_need(seq, len(tokens) + 1,
                                                                                 self._chunk(len(tokens))))]
            seq.num_computed_tokens = num_cached
            if seq.num_cached_on_admit < 0:
                seq.num_cached_on_admit = num_cached
                self.cached_prompt_tokens += num_cached
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append(self._entry(seq, n, len(tokens) - num_cached))
            budget -= n
            absorbed += cost
        return self._ordered(out)

    def _cut(self, seq: Sequence, computed: int, n: int) -> int:
        """``n`` new tokens from ``computed``, cut at the prompt's end under ``prompt_apart``."""
        p = seq.prompt_len
        return p - computed if self.prompt_apart and computed < p < computed + n else n

    def _ordered(self, out: SchedulerOutput) -> SchedulerOutput:
        """Under ``prompt_apart``, rows of output tokens (decodes, recomputed outputs) first, each
        group in its order: the backend runs the leading run absorbed and the prompt rows after it."""
        if self.prompt_apart:
            out.scheduled.sort(key=lambda s: s.num_cached < s.seq.prompt_len)
        return out

    # -- admission that keeps room for the running prefills --------------------------------------
    # A request is admitted with blocks for its first chunk only. Admitted next to running requests
    # whose prompts are not all computed yet, it could take blocks they need, and one of them (or
    # itself) would be preempted mid-prompt and its chunks recomputed, again at every re-admission
    # (head-wise SWA with recycling made this churn: docs/head_wise_swa.md). So, unless it would run
    # alone, a request is admitted only if every pool can give it and each running prefill the
    # blocks they still need to finish their known tokens (``SeqBlocks.prompt_need``: with
    # recycling, what an SWA row holds at most). Decode growth past the known tokens is not
    # reserved: it preempts as before.
    def _chunk(self, num_tokens: int) -> int:
        return self.cfg.max_num_batched_tokens if self.cfg.enable_chunked_prefill else num_tokens

    def _reserved(self, chunks) -> list[int]:
        """Sum over the running prefills (``chunks``: (seq, tokens left), those of the step's start
        and those admitted since) of their ``prompt_need`` after this step's holds."""
        total = [0] * len(self.kv.free_blocks())
        for seq, _ in chunks:
            if seq.status is Status.RUNNING:
                known = seq.num_tokens
                total = [t + x for t, x in zip(total, self.kv.prompt_need(seq, known + 1, self._chunk(known)))]
        return total

    def _fits_with(self, reserved: list[int], need: tuple[int, ...]) -> bool:
        return all(r + x <= f for r, x, f in zip(reserved, need, self.kv.free_blocks()))

    @staticmethod
    def _entry(seq: Sequence, n: int, need: int) -> ScheduledSeq:
        """``need``: the tokens not yet computed (``num_tokens - num_computed_tokens``)."""
        is_prefill = n > 1 or need > 1 or not seq.output_token_ids
        return ScheduledSeq(seq, n, seq.num_computed_tokens, is_prefill, n == need)

    def step_input(self, out: SchedulerOutput) -> StepInput:
        """``out`` as the runner receives it (plain data, sched/output.py): call it once for each
        step the runner runs, just before it runs (a PENDING token resolved meanwhile is then sent
        resolved). A steady decode row: one token and no block ids (or the one new block's)."""
        msg = StepInput(gone=self._gone)
        self._gone = []
        rows, new = msg.scheduled, msg.new
        head_wise = not self._uniform_block_size
        for s in out.scheduled:
            seq = s.seq
            c, n = s.num_cached, s.num_new
            if not seq.in_runner:
                seq.in_runner = True
                new.append(NewRequest(seq.seq_id, seq.request.prompt_token_ids, list(seq.output_token_ids),
                                      seq.request.params, seq.seed))
            if n == 1:       # decode: one token, by index
                prompt = seq.request.prompt_token_ids
                toks = [prompt[c] if c < len(prompt) else seq.output_token_ids[c - len(prompt)]]
            else:
                toks = token_slice(seq, c, c + n)
            blocks = seq.block_ids
            new_blocks = blocks[seq.sent_blocks:] if len(blocks) > seq.sent_blocks else []
            seq.sent_blocks = len(blocks)
            row = ScheduledRow(seq.seq_id, n, c, s.is_prefill, s.samples, toks, new_blocks)
            if head_wise:
                swa = seq.swa_block_ids
                m = len(swa[0]) if swa else 0
                if m > seq.sent_swa:
                    row.new_swa_block_ids = [r[seq.sent_swa:m] for r in swa]
                    seq.sent_swa = m
                row.swa_dead_below = seq.swa_dead_below
            rows.append(row)
        return msg

    def finish_step(self, scheduled: list[ScheduledSeq]) -> None:
        """A step's rows are computed: account their tokens, make newly full blocks findable by
        later requests and (with head-wise SWA recycling) give back blocks that left every future
        window."""
        bs, after_step = self._uniform_block_size, self.kv.after_step
        for s in scheduled:
            seq = s.seq
            c = seq.num_computed_tokens = seq.num_computed_tokens + s.num_new
            if not bs or c // bs > seq.num_registered_blocks:   # uniform tables: only when a block filled
                after_step(seq)

    def on_launch(self, out: SchedulerOutput) -> None:
        """Overlapped scheduling: the step is on the device and its tokens are not read yet. Its
        computed tokens count now (the next ``schedule`` builds on them) and each sampling row holds
        a PENDING token until ``update_from_output`` resolves it. Rows of sequences that finished
        meanwhile (by the step before) are left out: their results are discarded."""
        running = Status.RUNNING
        live = [s for s in out.scheduled if s.seq.status is running]
        self.finish_step(live)
        for s in live:
            if s.samples:
                s.seq.output_token_ids.append(PENDING)
        out.launched = True

    def update_from_output(self, out: SchedulerOutput, sampled) -> StepUpdate:
        """A step's sampled tokens (``sampled``: one per scheduled row, -1 where none): account the
        computed tokens (unless ``on_launch`` did), append each token (or resolve the PENDING one)
        and finish the rows stopped by a stop id (eos unless ignored, stop_token_ids; from
        min_tokens on) or by length. Stop strings need the tokenizer: the rows to check are
        returned, and the engine finishes a hit through ``finish``. Per row O(1) work; only rows
        that may stop are looked at again, after every row's token is in, in row order."""
        if not out.launched:
            self.finish_step(out.scheduled)
        update = StepUpdate()
        finished_status = Status.FINISHED
        rows, check = update.sampled_rows, []
        for i, (s, token) in enumerate(zip(out.scheduled, sampled)):
            seq = s.seq
            if not s.samples or seq.status is finished_status:   # finished: an overlapped extra step
                continue
            toks = seq.output_token_ids
            if toks and toks[-1] == PENDING:
                toks[-1] = token
            else:
                toks.append(token)
            rows.append(i)
            n = len(toks)
            p = seq.request.params
            # the common row: below its length limit, no stop string, a token that cannot stop it
            if n < seq.length_limit and (token not in seq.stop_ids or n < p.min_tokens) and not p.stop:
                continue
            check.append((seq, token))
        for seq, token in check:
            p = seq.request.params
            n = len(seq.output_token_ids)
            # before min_tokens the sampler masks eos and stop ids; stop strings are not checked (as vLLM)
            if n >= p.min_tokens:
                if token in seq.stop_ids:
                    seq.finish_reason = "stop"
                    self.finish(seq)
                    update.finished.append(seq)
                    continue
                if p.stop:
                    update.stop_string_rows.append((seq, token))
            if n >= seq.length_limit:         # max_tokens, or max_model_len reached
                seq.finish_reason = "length"
                self.finish(seq)
                update.finished.append(seq)
        return update

    def finish(self, seq: Sequence) -> None:
        """A finished sequence, or a waiting or running one dropped because its request failed."""
        if seq.status is Status.RUNNING:     # status, not a scan of the list, says where it is
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)
        seq.status = Status.FINISHED
