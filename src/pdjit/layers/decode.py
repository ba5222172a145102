"""Fluid 1.x's beam search layers: ``beam_search`` and ``beam_search_decode`` over LoD tensors,
``gather_tree``, and the dense decoding API of Fluid 1.8 (``Decoder``, ``BeamSearchDecoder``,
``dynamic_decode``: a ``While`` over the decoder's steps). The ops are in
``pdjit.ops.beam_search``."""
from __future__ import annotations

import builtins
import collections

import numpy as np

from pdjit.framework.program import default_main_program as fluid_program
from pdjit.layers.control_flow import (
    While,
    _check_array,
    array_write,
    create_array,
    increment,
    tensor_array_to_tensor,
)
from pdjit.layers.image import pad, shape
from pdjit.layers.layer_helper import LayerHelper, check_variable
from pdjit.layers.math_ops import (
    elementwise_add,
    elementwise_floordiv,
    elementwise_mod,
    elementwise_mul,
    elementwise_sub,
    equal,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    scale,
)
from pdjit.layers.nn import softmax
from pdjit.layers.recurrent import _building_in as _in_block
from pdjit.layers.shape_ops import (
    argmax,
    expand,
    gather,
    reduce_sum,
    reshape,
    slice,
    squeeze,
    topk,
    transpose,
    unsqueeze,
)
from pdjit.layers.tensor import (
    assign,
    cast,
    fill_constant,
    fill_constant_batch_size_like,
    range,
    zeros_like,
)

__all__ = ["beam_search", "beam_search_decode", "gather_tree", "Decoder", "BeamSearchDecoder",
           "dynamic_decode", "DecodeHelper", "TrainingHelper", "GreedyEmbeddingHelper",
           "SampleEmbeddingHelper", "BasicDecoder"]


def beam_search(pre_ids, pre_scores, ids, scores, beam_size, end_id, level=0,
                is_accumulated=True, name=None, return_parent_idx=False):
    """One step of beam search (Fluid 1.8's ``layers.beam_search``): per source sentence (LoD
    level ``level`` of ``scores``) the ``beam_size`` best continuations of the live prefixes.
    Returns ``(selected_ids, selected_scores)`` (and ``parent_idx`` when
    ``return_parent_idx``), LoD ``[sources -> prefixes, prefixes -> selected]``."""
    layer = "beam_search"
    for arg, v in (("pre_ids", pre_ids), ("pre_scores", pre_scores), ("scores", scores)):
        check_variable(v, arg, layer)
    if ids is not None:
        check_variable(ids, "ids", layer)
    for arg, v in (("beam_size", beam_size), ("end_id", end_id), ("level", level)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{layer}: {arg} must be an int, got {v!r}")
    if beam_size < 1:
        raise ValueError(f"{layer}: beam_size must be >= 1, got {beam_size}")
    helper = LayerHelper(layer, name=name)
    inputs = {"pre_ids": [pre_ids], "pre_scores": [pre_scores], "scores": [scores]}
    if ids is not None:
        inputs["ids"] = [ids]
    sel_scores = helper.create_variable_for_type_inference(pre_scores.dtype)
    sel_ids = helper.create_variable_for_type_inference(pre_ids.dtype)
    parent_idx = helper.create_variable_for_type_inference("int32")
    helper.append_op("beam_search", inputs=inputs,
                     outputs={"selected_ids": [sel_ids], "selected_scores": [sel_scores],
                              "parent_idx": [parent_idx]},
                     attrs={"level": level, "beam_size": beam_size, "end_id": end_id,
                            "is_accumulated": bool(is_accumulated)})
    if return_parent_idx:
        return sel_ids, sel_scores, parent_idx
    return sel_ids, sel_scores


def beam_search_decode(ids, scores, beam_size, end_id, name=None):
    """The hypotheses of each source traced back through the tensor arrays ``ids`` and
    ``scores`` of the beam_search steps, best first: ``(sentence_ids, sentence_scores)``, LoD
    ``[sources -> hypotheses, hypotheses -> ids]``."""
    _check_array(ids, "beam_search_decode")
    _check_array(scores, "beam_search_decode")
    helper = LayerHelper("beam_search_decode", name=name)
    sentence_ids = helper.create_variable_for_type_inference(ids.dtype)
    sentence_scores = helper.create_variable_for_type_inference(scores.dtype)
    helper.append_op("beam_search_decode", inputs={"Ids": [ids], "Scores": [scores]},
                     outputs={"SentenceIds": [sentence_ids],
                              "SentenceScores": [sentence_scores]},
                     attrs={"beam_size": int(beam_size), "end_id": int(end_id)})
    return sentence_ids, sentence_scores



def gather_tree(ids, parents):
    """Each final beam's ids traced back through ``parents`` (both ``[time, batch, beam]``)."""
    check_variable(ids, "ids", "gather_tree")
    check_variable(parents, "parents", "gather_tree")
    helper = LayerHelper("gather_tree")
    out = helper.create_variable_for_type_inference(ids.dtype, stop_gradient=True)
    helper.append_op("gather_tree", inputs={"Ids": [ids], "Parents": [parents]},
                     outputs={"Out": [out]})
    return out


# ---- Decoder, BeamSearchDecoder, dynamic_decode (Fluid 1.8's dense decoding API) ----------------
def _leaves(s) -> list:
    if isinstance(s, (list, tuple)):
        return [leaf for x in s for leaf in _leaves(x)]
    if isinstance(s, dict):
        return [leaf for k in s for leaf in _leaves(s[k])]
    return [s]


def _map(fn, *structures):
    """``fn`` over the leaves of ``structures`` (nested alike), rebuilt as the first one
    (namedtuples included)."""
    first = structures[0]
    if isinstance(first, (list, tuple)):
        items = [_map(fn, *(s[i] for s in structures)) for i in builtins.range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    if isinstance(first, dict):
        return {k: _map(fn, *(s[k] for s in structures)) for k in first}
    return fn(*structures)


class Decoder:
    """The decoding protocol ``dynamic_decode`` drives: ``initialize(inits) -> (inputs, states,
    finished)``, ``step(time, inputs, states) -> (outputs, states, next_inputs, finished)``,
    ``finalize(outputs, final_states, sequence_lengths) -> (outputs, states)``."""

    def initialize(self, inits):
        raise NotImplementedError

    def step(self, time, inputs, states, **kwargs):
        raise NotImplementedError

    def finalize(self, outputs, final_states, sequence_lengths):
        raise NotImplementedError

    @property
    def tracks_own_finished(self):
        return False


class BeamSearchDecoder(Decoder):
    """Fluid 1.8's ``BeamSearchDecoder(cell, start_token, end_token, beam_size, embedding_fn,
    output_fn)``: each step runs ``cell`` on every beam, scores each beam's continuations by
    accumulated log-probability (a finished beam only continues with ``end_token`` at no
    cost), keeps the ``beam_size`` best per batch entry and reorders the cell states to them.
    Outputs per step: ``scores``, ``predicted_ids``, ``parent_ids`` ``[batch, beam]``;
    ``finalize`` traces the ids back (``gather_tree``)."""

    OutputWrapper = collections.namedtuple("OutputWrapper",
                                           ("scores", "predicted_ids", "parent_ids"))
    StateWrapper = collections.namedtuple("StateWrapper",
                                          ("cell_states", "log_probs", "finished", "lengths"))

    def __init__(self, cell, start_token, end_token, beam_size, embedding_fn=None,
                 output_fn=None):
        from pdjit.layers.rnn_cells import RNNCell

        if not isinstance(cell, RNNCell):
            raise TypeError(f"BeamSearchDecoder: cell must be an RNNCell, got "
                            f"{type(cell).__name__}")
        for arg, v in (("start_token", start_token), ("end_token", end_token),
                       ("beam_size", beam_size)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"BeamSearchDecoder: {arg} must be an int, got {v!r}")
        if beam_size < 1:
            raise ValueError(f"BeamSearchDecoder: beam_size must be >= 1, got {beam_size}")
        self.cell, self.start_token, self.end_token = cell, start_token, end_token
        self.beam_size, self.embedding_fn, self.output_fn = beam_size, embedding_fn, output_fn
        self.kinf = 1e9

    @staticmethod
    def tile_beam_merge_with_batch(x, beam_size):
        """``[batch, ...]`` -> ``[batch * beam_size, ...]``, each entry repeated beam_size times
        in a row (to feed an encoder's output to the beams)."""
        check_variable(x, "x", "BeamSearchDecoder.tile_beam_merge_with_batch")
        x = expand(unsqueeze(x, [1]), [1, beam_size] + [1] * (len(x.shape) - 1))
        return reshape(x, [-1] + [int(d) for d in x.shape[2:]])

    def _expand_to_beam_size(self, x):
        return expand(unsqueeze(x, [1]), [1, self.beam_size] + [1] * (len(x.shape) - 1))

    def _merge_batch_beams(self, x):
        return reshape(x, [-1] + [int(d) for d in x.shape[2:]])

    def _split_batch_beams(self, x):
        return reshape(x, [-1, self.beam_size] + [int(d) for d in x.shape[1:]])

    def _gather(self, x, beam_indices):
        """``x[b, beam_indices[b, k]]`` for every ``b, k`` (``x``: ``[batch, beam, ...]``)."""
        flat = elementwise_add(beam_indices, self._batch_offsets, axis=0)
        rows = gather(self._merge_batch_beams(x), reshape(flat, [-1]))
        return self._split_batch_beams(rows)

    def initialize(self, initial_cell_states):
        state = _leaves(initial_cell_states)[0]
        check_variable(state, "initial_cell_states", "BeamSearchDecoder.initialize")
        beam = self.beam_size
        batch = cast(slice(shape(state), axes=[0], starts=[0], ends=[1]), "int64")
        # the first flat row of each batch entry's beams: b * beam_size
        self._batch_offsets = scale(range(0, batch, 1, "int64"), scale=float(beam))
        self._batch_offsets.stop_gradient = True
        init_cell_states = _map(self._expand_to_beam_size, initial_cell_states)
        init_inputs = fill_constant_batch_size_like(state, [-1, beam], "int64",
                                                    self.start_token)
        ones = fill_constant_batch_size_like(state, [-1, beam], "float32", 1.0)
        first_only = assign(np.array([0.0] + [-self.kinf] * (beam - 1), np.float32))
        log_probs = elementwise_mul(ones, first_only)   # only beam 0 is live at first
        init_finished = fill_constant_batch_size_like(state, [-1, beam], "bool", False)
        init_lengths = fill_constant_batch_size_like(state, [-1, beam], "int64", 0)
        if self.embedding_fn is not None:
            init_inputs = self.embedding_fn(init_inputs)
        return (init_inputs,
                self.StateWrapper(init_cell_states, log_probs, init_finished, init_lengths),
                init_finished)

    def _beam_search_step(self, time, logits, next_cell_states, beam_state):
        vocab = int(logits.shape[-1])
        if vocab <= self.end_token:
            raise ValueError(f"BeamSearchDecoder: end_token {self.end_token} is outside the "
                             f"vocabulary of {vocab} the logits score")
        vocab_t = fill_constant([1], "int64", vocab)
        noend = np.full([vocab], -self.kinf, np.float32)
        noend[self.end_token] = 0.0
        step_log_probs = log(softmax(logits))
        done = cast(beam_state.finished, step_log_probs.dtype)
        # a finished beam continues with end_token only, at no cost
        step_log_probs = elementwise_add(
            elementwise_mul(step_log_probs, 1.0 - done, axis=0),
            elementwise_mul(expand(unsqueeze(done, [2]), [1, 1, vocab]), assign(noend)))
        log_probs = elementwise_add(step_log_probs, beam_state.log_probs, axis=0)
        scores = reshape(log_probs, [-1, self.beam_size * vocab])
        topk_scores, topk_indices = topk(scores, k=self.beam_size)
        beam_indices = elementwise_floordiv(topk_indices, vocab_t)
        token_indices = elementwise_mod(topk_indices, vocab_t)
        next_cell_states = _map(lambda x: self._gather(x, beam_indices), next_cell_states)
        next_finished = self._gather(beam_state.finished, beam_indices)
        next_lengths = self._gather(beam_state.lengths, beam_indices)
        next_lengths = next_lengths + cast(logical_not(next_finished), next_lengths.dtype)
        end_t = fill_constant([1], "int64", self.end_token)
        next_finished = logical_or(next_finished, equal(token_indices, end_t))
        return (self.OutputWrapper(topk_scores, token_indices, beam_indices),
                self.StateWrapper(next_cell_states, topk_scores, next_finished, next_lengths))

    def step(self, time, inputs, states, **kwargs):
        inputs = _map(self._merge_batch_beams, inputs)
        cell_states = _map(self._merge_batch_beams, states.cell_states)
        cell_outputs, next_cell_states = self.cell(inputs, cell_states, **kwargs)
        cell_outputs = _map(self._split_batch_beams, cell_outputs)
        next_cell_states = _map(self._split_batch_beams, next_cell_states)
        if self.output_fn is not None:
            cell_outputs = self.output_fn(cell_outputs)
        output, state = self._beam_search_step(time, cell_outputs, next_cell_states, states)
        next_inputs = output.predicted_ids
        if self.embedding_fn is not None:
            next_inputs = self.embedding_fn(next_inputs)
        return output, state, next_inputs, state.finished

    def finalize(self, outputs, final_states, sequence_lengths):
        return gather_tree(outputs.predicted_ids, outputs.parent_ids), final_states

    @property
    def tracks_own_finished(self):
        return True


def dynamic_decode(decoder, inits=None, max_step_num=None, output_time_major=False,
                   impute_finished=False, is_test=False, return_length=False, **kwargs):
    """Run ``decoder`` step by step in a ``While`` until every entry finished or
    ``max_step_num`` steps ran (Fluid 1.8's ``dynamic_decode``). Returns ``(outputs,
    final_states)`` (and the sequence lengths with ``return_length``); the outputs are the
    steps' outputs stacked on the time axis (dim 1 unless ``output_time_major``), passed
    through ``decoder.finalize``."""
    if not isinstance(decoder, Decoder):
        raise TypeError(f"dynamic_decode: decoder must be a Decoder (e.g. BeamSearchDecoder), "
                        f"got {type(decoder).__name__}")
    inputs, states, finished = decoder.initialize(inits)
    inputs = _map(lambda x: assign(x), inputs)      # the loop's own variables
    states = _map(lambda x: assign(x), states)
    finished = assign(finished)
    step_idx = fill_constant([1], "int64", 0)
    limit = fill_constant([1], "int64", max_step_num) if max_step_num is not None else None
    lengths = cast(zeros_like(finished), "int64")
    zero = fill_constant([1], "float32", 0.0)

    def _all_done(f):
        return equal(reduce_sum(cast(logical_not(f), "float32")), zero)

    cond = logical_not(_all_done(finished))
    loop = While(cond, is_test=is_test)
    arrays = None
    with loop.block():
        outputs, next_states, next_inputs, next_finished = decoder.step(step_idx, inputs,
                                                                         states, **kwargs)
        if not decoder.tracks_own_finished:
            next_finished = logical_or(next_finished, finished)
            next_lengths = elementwise_add(lengths,
                                           cast(logical_not(finished), lengths.dtype))
            if impute_finished:   # a finished entry keeps its states
                keep = cast(finished, "float32")

                def _keep(old, new):
                    k = cast(keep, old.dtype) if old.dtype != keep.dtype else keep
                    return elementwise_sub(elementwise_mul(old, k, axis=0),
                                           elementwise_mul(new, k - 1.0, axis=0))
                next_states = _map(_keep, states, next_states)
        else:
            next_lengths = getattr(next_states, "lengths", lengths)
        parent = fluid_program().block(fluid_program().current_block().parent_idx)
        with _in_block(parent):
            arrays = _map(lambda x: create_array(x.dtype), outputs)
        _map(lambda x, a: array_write(x, i=step_idx, array=a), outputs, arrays)
        increment(step_idx, 1.0, in_place=True)
        assign(next_finished, finished)
        assign(next_lengths, lengths)
        _map(lambda new, old: assign(new, old), next_inputs, inputs)
        _map(lambda new, old: assign(new, old), next_states, states)
        go_on = logical_not(_all_done(finished))
        if limit is not None:   # as Fluid: steps 0..max_step_num (max_step_num + 1 of them)
            go_on = logical_and(go_on, less_equal(step_idx, limit))
        assign(go_on, cond)
    final_outputs = _map(lambda a: tensor_array_to_tensor(a, axis=0, use_stack=True)[0],
                         arrays)
    final_states = states
    try:
        final_outputs, final_states = decoder.finalize(final_outputs, final_states, lengths)
    except NotImplementedError:
        pass
    if not output_time_major:
        final_outputs = _map(lambda x: transpose(x, [1, 0] + list(builtins.range(2, len(
            x.shape)))), final_outputs)
    return (final_outputs, final_states, lengths) if return_length else \
        (final_outputs, final_states)


# ---- DecodeHelper, TrainingHelper, GreedyEmbeddingHelper, BasicDecoder ---------------------------
def _time_slice(x, t, axis: int):
    """``x`` at time ``t`` (an int64 ``[1]`` Variable) along ``axis``, that axis dropped."""
    end = elementwise_add(t, fill_constant([1], t.dtype, 1))
    return squeeze(slice(x, axes=[axis], starts=[t], ends=[end]), axes=[axis])


class DecodeHelper:
    """How a :class:`BasicDecoder` gets its inputs: ``initialize() -> (inputs, finished)``,
    ``sample(time, outputs, states) -> ids``, ``next_inputs(time, outputs, states, ids) ->
    (finished, next_inputs, next_states)``."""

    def initialize(self):
        raise NotImplementedError

    def sample(self, time, outputs, states):
        raise NotImplementedError

    def next_inputs(self, time, outputs, states, sample_ids):
        raise NotImplementedError


class TrainingHelper(DecodeHelper):
    """Teacher forcing (Fluid 1.8's ``TrainingHelper(inputs, sequence_length, time_major)``):
    step ``t`` reads ``inputs[:, t]``; an entry is finished once ``t + 1`` reaches its
    ``sequence_length``; ``sample`` is the arg-max of the outputs."""

    def __init__(self, inputs, sequence_length, time_major=False):
        for x in _leaves(inputs):
            check_variable(x, "inputs", "TrainingHelper")
        check_variable(sequence_length, "sequence_length", "TrainingHelper")
        self.inputs, self.time_major = inputs, bool(time_major)
        self.sequence_length = sequence_length
        axis = 0 if self.time_major else 1
        # one padding step at the end, so the step after the last still has an input to read
        self._padded = _map(lambda x: pad(x, paddings=[p for d in builtins.range(len(x.shape))
                                                       for p in ((0, 1) if d == axis
                                                                 else (0, 0))]), inputs)

    def initialize(self):
        zero = fill_constant([1], self.sequence_length.dtype, 0)
        finished = equal(self.sequence_length, zero)
        t0 = fill_constant([1], "int64", 0)
        return _map(lambda x: _time_slice(x, t0, 0 if self.time_major else 1),
                    self.inputs), finished

    def sample(self, time, outputs, states):
        return argmax(outputs, axis=-1)

    def next_inputs(self, time, outputs, states, sample_ids):
        nxt = elementwise_add(cast(time, "int64"), fill_constant([1], "int64", 1))
        finished = less_equal(cast(self.sequence_length, "int64"), nxt)
        axis = 0 if self.time_major else 1
        return finished, _map(lambda x: _time_slice(x, nxt, axis), self._padded), states


class GreedyEmbeddingHelper(DecodeHelper):
    """Greedy decoding (Fluid 1.8's ``GreedyEmbeddingHelper(embedding_fn, start_tokens,
    end_token)``): the arg-max id of each step is embedded as the next input; an entry is
    finished once it produced ``end_token``."""

    def __init__(self, embedding_fn, start_tokens, end_token):
        if not callable(embedding_fn):
            raise TypeError(f"GreedyEmbeddingHelper: embedding_fn must be callable, got "
                            f"{type(embedding_fn).__name__}")
        check_variable(start_tokens, "start_tokens", "GreedyEmbeddingHelper")
        if isinstance(end_token, bool) or not isinstance(end_token, int):
            raise TypeError(f"GreedyEmbeddingHelper: end_token must be an int, got "
                            f"{end_token!r}")
        self.embedding_fn, self.start_tokens = embedding_fn, start_tokens
        self.end_token = end_token

    def initialize(self):
        finished = fill_constant_batch_size_like(self.start_tokens, [-1], "bool", False)
        return self.embedding_fn(self.start_tokens), finished

    def sample(self, time, outputs, states):
        return argmax(outputs, axis=-1)

    def next_inputs(self, time, outputs, states, sample_ids):
        end = fill_constant([1], sample_ids.dtype, self.end_token)
        return equal(sample_ids, end), self.embedding_fn(sample_ids), states


class SampleEmbeddingHelper(GreedyEmbeddingHelper):
    """Sampled decoding (Fluid 1.8's ``SampleEmbeddingHelper(embedding_fn, start_tokens,
    end_token, softmax_temperature=None, seed=None)``): each step draws its id from
    ``softmax(outputs / softmax_temperature)`` (a ``sampling_id`` op; no gradient flows
    through the draw) and embeds it as the next input; an entry is finished once it produced
    ``end_token``. ``seed`` fixes the draws (``None``: the program's random stream)."""

    def __init__(self, embedding_fn, start_tokens, end_token, softmax_temperature=None,
                 seed=None):
        super().__init__(embedding_fn, start_tokens, end_token)
        if softmax_temperature is not None:
            if isinstance(softmax_temperature, bool) or not isinstance(
                    softmax_temperature, (int, float)) or not softmax_temperature > 0:
                raise ValueError(f"SampleEmbeddingHelper: softmax_temperature must be a "
                                 f"positive number or None, got {softmax_temperature!r}")
            softmax_temperature = float(softmax_temperature)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"SampleEmbeddingHelper: seed must be an int or None, got "
                            f"{seed!r}")
        self.softmax_temperature, self.seed = softmax_temperature, seed

    def sample(self, time, outputs, states):
        from pdjit.layers.manip import sampling_id

        logits = (outputs if self.softmax_temperature is None
                  else scale(outputs, 1.0 / self.softmax_temperature))
        probs = softmax(logits)
        probs.stop_gradient = True
        ids = sampling_id(probs, seed=self.seed or 0)
        return ids if ids.dtype == self.start_tokens.dtype else cast(ids,
                                                                      self.start_tokens.dtype)


class BasicDecoder(Decoder):
    """Fluid 1.8's ``BasicDecoder(cell, helper, output_fn)``: each step runs ``cell`` and
    ``output_fn``, and the helper picks the ids and the next inputs. Outputs per step:
    ``cell_outputs`` and ``sample_ids``."""

    OutputWrapper = collections.namedtuple("OutputWrapper", ("cell_outputs", "sample_ids"))

    def __init__(self, cell, helper, output_fn=None):
        from pdjit.layers.rnn_cells import RNNCell

        if not isinstance(cell, RNNCell):
            raise TypeError(f"BasicDecoder: cell must be an RNNCell, got {type(cell).__name__}")
        if not isinstance(helper, DecodeHelper):
            raise TypeError(f"BasicDecoder: helper must be a DecodeHelper, got "
                            f"{type(helper).__name__}")
        self.cell, self.helper, self.output_fn = cell, helper, output_fn

    def initialize(self, initial_cell_states):
        inputs, finished = self.helper.initialize()
        return inputs, initial_cell_states, finished

    def step(self, time, inputs, states, **kwargs):
        cell_outputs, cell_states = self.cell(inputs, states, **kwargs)
        if self.output_fn is not None:
            cell_outputs = self.output_fn(cell_outputs)
        sample_ids = self.helper.sample(time, cell_outputs, cell_states)
        sample_ids.stop_gradient = True
        finished, next_inputs, next_states = self.helper.next_inputs(time, cell_outputs,
                                                                     cell_states, sample_ids)
        return (self.OutputWrapper(cell_outputs, sample_ids), next_states, next_inputs,
                finished)

    def finalize(self, outputs, final_states, sequence_lengths):
        raise NotImplementedError   # (dynamic_decode keeps the stacked outputs as they are)
