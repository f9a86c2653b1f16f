"""The per-slot penalty token state (worker/penalties.py) and its host ledger
(sampling_batch.PenaltySlots) against the numpy reference of tests/helpers/sampling_reference.py:
admission, the sampled ids counted on the device step by step, release and slot reuse, and
re-admission of a sequence that comes back in another slot (preemption)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.sampling_reference import penalties as reference_penalties
from test_sampler import EOS, assert_same_logits, fixed_logits, make_seq, tensor, to_numpy

from paddle_mla.platform.tensor_api import torch
from paddle_mla.sched.request import PENDING
from paddle_mla.worker import sampler
from paddle_mla.worker.penalties import PenaltyState
from paddle_mla.worker.sampling_batch import PenaltySlots, PenaltyStep, build_sampling_batch

VOCAB = 16
NONE = np.zeros(0, dtype=np.int64)


def rows_step(rows, slots, repetition, frequency, presence) -> PenaltyStep:
    """A step over already admitted slots (no admissions)."""
    def f32(v):
        return np.asarray(v, dtype=np.float32)

    return PenaltyStep(rows=np.asarray(rows, dtype=np.int64), slots=np.asarray(slots, dtype=np.int64),
                       repetition=f32(repetition), frequency=f32(frequency), presence=f32(presence),
                       admit_slots=NONE, admit_prompt=NONE, admit_output=NONE)


def ids(values):
    return torch.from_numpy(np.asarray(values, dtype=np.int64))


def test_admit_record_release_match_reference():
    state = PenaltyState(4, VOCAB, "cpu")
    assert not state.allocated      # nothing on the device before the first penalized request
    prompt_a, out_a, prompt_b, out_b = [1, 2, 3], [3, 4, 4], [5, 5], []
    state.admit(2, prompt_a, out_a)
    state.admit(0, prompt_b, out_b)
    assert state.allocated and state.output_counts.dtype == torch.int32
    params = dict(repetition=[1.5, 0.8], frequency=[0.7, 0.4], presence=[0.5, -0.3])
    step = rows_step([0, 1], [2, 0], **params)

    def check(logits):
        ours = to_numpy(state.apply(tensor(logits), step))
        ref = np.stack([reference_penalties(logits[0], prompt_a, out_a, 0.5, 0.7, 1.5),
                        reference_penalties(logits[1], prompt_b, out_b, -0.3, 0.4, 0.8)])
        assert_same_logits(ours, ref)

    check(fixed_logits(2, VOCAB, seed=1))
    for sampled in ([4, 9], [9, 5], [3, 5]):       # counted on the device, as the runner does
        state.record(step, ids(sampled))
        out_a, out_b = out_a + [sampled[0]], out_b + [sampled[1]]
        check(fixed_logits(2, VOCAB, seed=sampled[0]))
    counts = state.output_counts.cpu().numpy()
    assert counts[2].tolist() == np.bincount(out_a, minlength=VOCAB).tolist()
    assert counts[0].tolist() == np.bincount(out_b, minlength=VOCAB).tolist()
    assert not counts[[1, 3]].any()        # other slots untouched

    state.release(2)
    assert not state.output_counts.cpu().numpy()[2].any() and not state.prompt_seen.cpu().numpy()[2].any()
    logits = fixed_logits(2, VOCAB, seed=4)
    assert np.array_equal(to_numpy(state.apply(tensor(logits), step))[0], logits[0])   # nothing seen any more
    state.admit(2, [7], [8, 8])            # the slot's next owner starts from its own tokens only
    ref = reference_penalties(logits[0], [7], [8, 8], 0.5, 0.7, 1.5)
    assert_same_logits(to_numpy(state.apply(tensor(logits), step))[:1], ref[None])


def test_apply_touches_only_the_penalized_rows():
    state = PenaltyState(3, VOCAB, "cpu")
    state.admit(1, [2, 6], [6, 7])
    logits = fixed_logits(3, VOCAB, seed=2)
    step = rows_step([1], [1], [1.3], [0.6], [0.2])
    ours = to_numpy(state.apply(tensor(logits), step))
    assert np.array_equal(ours[[0, 2]], logits[[0, 2]].astype(np.float64))
    assert_same_logits(ours[1:2], reference_penalties(logits[1], [2, 6], [6, 7], 0.2, 0.6, 1.3)[None])
    state.record(step, ids([0, 11, 0]))    # only row 1's id is counted, into slot 1
    assert state.output_counts.cpu().numpy().sum(axis=1).tolist() == [0, 3, 0]


def test_ledger_admits_a_sequence_once_and_again_when_its_slot_changes():
    ledger = PenaltySlots(4)
    a = make_seq([1, 2, 3], [], frequency_penalty=0.5, repetition_penalty=1.3)
    b = make_seq([4], [5])                                   # no penalty: not in the plan
    c = make_seq([6, 7], [8], presence_penalty=0.4)          # no repetition penalty: its prompt stays home

    def plan(seqs, slots):
        return build_sampling_batch(seqs, EOS, VOCAB, slots=np.asarray(slots, dtype=np.int64), ledger=ledger).penalty

    first = plan([b, a], [1, 3])
    assert first.rows.tolist() == [1] and first.slots.tolist() == [3] and first.admit_slots.tolist() == [3]
    assert first.admit_prompt.tolist() == [3 * VOCAB + t for t in [1, 2, 3]] and first.admit_output.size == 0
    for token in (9, 10):                      # steady steps: nothing of the tokens goes up
        a.output_token_ids.append(token)
        steady = plan([b, a], [1, 3])
        assert steady.admit_slots.size == steady.admit_prompt.size == steady.admit_output.size == 0
    # back after a preemption in another slot: prompt and output so far, once
    back = plan([a], [0])
    assert back.admit_slots.tolist() == [0]
    assert back.admit_prompt.tolist() == [1, 2, 3] and back.admit_output.tolist() == [9, 10]   # slot 0: no offset
    a.output_token_ids.append(13)             # the token of that step
    # slot 3 reused by another sequence: admitted with its output only
    reuse = plan([a, c], [0, 3])
    assert reuse.admit_slots.tolist() == [3] and reuse.admit_prompt.size == 0
    assert reuse.admit_output.tolist() == [3 * VOCAB + 8]
    # a count that is not the sequence's output (a token the device did not count): admitted again
    a.output_token_ids += [11, 12]
    assert plan([a], [0]).admit_slots.tolist() == [0]
    # the tokens of a re-admitted slot must all be on the host
    a.output_token_ids.append(PENDING)
    ledger.release(0)
    with pytest.raises(RuntimeError, match="still on the device"):
        plan([a], [0])


def test_steps_through_the_state_match_reference():
    """Greedy steps of three sequences through the runner's path (ledger + device state, sampled ids
    counted on the device): each token is the argmax of the reference; one sequence moves slot
    (preemption) and a new one takes a finished one's slot. Tokens go up only at admissions."""
    state = PenaltyState(4, VOCAB, "cpu")
    seqs = [make_seq([1, 2, 3, 3], repetition_penalty=1.4, frequency_penalty=0.3),
            make_seq([4, 5], presence_penalty=1.1),
            make_seq([6], [])]                                       # no penalty
    slots = [2, 0, 1]
    rng = np.random.default_rng(0)
    expected_admitted = 4            # the first row's prompt (repetition penalty); the second has none
    for step_no in range(14):
        if step_no == 6:                          # seq 0 preempted, back in slot 3 with its output
            slots[0] = 3
            expected_admitted += 4 + len(seqs[0].output_token_ids)
        if step_no == 9:
            # seq 1 done, its slot 0 given to a new one with no release call: the admission clears it
            seqs[1] = make_seq([7, 7, 8], frequency_penalty=1.5, repetition_penalty=0.9)
            expected_admitted += 3
        logits = rng.standard_normal((3, VOCAB)).astype(np.float32) * 2
        for row, seq in enumerate(seqs):      # make the plain argmax a token the penalties must move
            if seq.output_token_ids:
                logits[row, seq.output_token_ids[-1]] += 3.0
        batch = build_sampling_batch(seqs, EOS, VOCAB, slots=np.asarray(slots, dtype=np.int64), ledger=state.ledger)
        packed, _ = sampler.sample_step_ids(tensor(logits), batch, None, state)
        got = sampler.read_to_host(packed).astype(np.int64)
        for row, seq in enumerate(seqs):
            p = seq.params
            ref = reference_penalties(logits[row], seq.request.prompt_token_ids, seq.output_token_ids,
                                      p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
            assert got[row] == int(np.argmax(ref)), f"step {step_no} row {row}"
            seq.output_token_ids.append(int(got[row]))
    assert state.ledger.tokens_admitted == expected_admitted


def test_step_upload_does_not_grow_with_the_output():
    """200 steps of a penalized row through the runner's path: after the admission step each step
    uploads the same sampler arrays (row, slot, penalties), and the counts stay the output's."""
    state = PenaltyState(2, VOCAB, "cpu")
    seq = make_seq([1, 2, 3], seed=5, temperature=1.0, repetition_penalty=1.1, frequency_penalty=0.2)
    sizes = []
    for _ in range(200):
        batch = build_sampling_batch([seq], EOS, VOCAB, slots=np.array([1], dtype=np.int64), ledger=state.ledger)
        sizes.append(sum(a.size for a in sampler.device_arrays(batch).values()))
        _, sampled = sampler.sample_step_ids(tensor(fixed_logits(1, VOCAB, seed=len(sizes))), batch, None, state)
        seq.output_token_ids.append(int(sampler.read_to_host(sampled)[0]))
    assert sizes[0] == sizes[1] + 1 + 3 and sizes[1:] == [sizes[1]] * 199   # admission: slot + prompt
    assert sizes[1] == 5 + 4     # penalty row, slot, 3 penalties; temperature, seed, step, random flag
    counts = state.output_counts.cpu().numpy()[1]
    assert counts.tolist() == np.bincount(seq.output_token_ids, minlength=VOCAB).tolist()
