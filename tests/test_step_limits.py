"""The scheduler honours the parameter roles (radiance/engine/selection/step_limits.py): a library
whose rows serve `M <= 5` (M: seq_chunk) gets steps cut at 5 tokens, one whose attention serves
`seqs <= 2` (seqs: capacity) steps of at most 2 sequences, and the tokens are those of uncut steps.
`narrow` is libref's rows under another name (not a reference library), with those bounds added;
the test's home shadows libr4d and libref with empty libraries, so nothing else serves above them."""

from pathlib import Path

import pytest

from radiance.abi import RAD_STEP_CONTEXT_LENS, RAD_STEP_IDS
from radiance.config import Config
from radiance.generation.engine import Engine
from radiance.generation.sequence import SamplingParams
from radiance.generation.text import TextCodec
from radiance.ranks.worker import Worker

LIBREF = Path(__file__).parents[1] / "plugins" / "kernels" / "libref"

NARROW = f"""
import dataclasses
import importlib.util
import sys

_spec = importlib.util.spec_from_file_location("narrow_libref", {str(LIBREF / "__init__.py")!r},
                                               submodule_search_locations=[{str(LIBREF)!r}])
_ref = importlib.util.module_from_spec(_spec)
sys.modules["narrow_libref"] = _ref
_spec.loader.exec_module(_ref)
BOUNDS = {{"gemm": [BOUND_M], "attention": [BOUND_SEQS]}}
SCHEMAS = _ref.SCHEMAS
ROWS = [dataclasses.replace(info, name="narrow_" + info.name,
                            constraints=[*info.constraints, *(b for b in BOUNDS.get(info.op, []) if b is not None)])
        for info in _ref.ROWS]

def rad_kernel_collective(i):
    return _ref.rad_kernel_collective(i)
"""

PROMPTS = [list(range(1, 40)), [5, 9, 200, 17], list(range(100, 123))]


def run(model, home, kernels, bound_m="None", bound_seqs="None"):
    """Every prompt to 5 greedy tokens in one engine of 3 sequences and 16-token steps: (outputs,
    each step's (tokens, sequences), the worker's step limits, its selection notes)."""
    if kernels == "narrow":
        home.kernel("narrow", NARROW.replace("BOUND_M", bound_m).replace("BOUND_SEQS", bound_seqs))
        for shadowed in ("libr4d", "libref"):
            home.kernel(shadowed, "SCHEMAS = []\nROWS = []\n")
    config = Config(model=str(model), radiance_home=str(home.root), kernels=kernels, accept_reference=kernels == "libref",
                    progress=False, max_seqs=3, max_step_tokens=16)
    worker = Worker(config).build()
    try:
        steps = []

        def execute(arrays):
            steps.append((len(arrays[RAD_STEP_IDS]), len(arrays[RAD_STEP_CONTEXT_LENS])))
            return worker.execute(arrays)
        container = worker.model.container
        text = TextCodec(container.tokenizer, container.chat_template, worker.model.hyper)
        engine = Engine(config, execute, text, limits=worker.step_limits)
        params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
        sequences = [engine.add(prompt, params) for prompt in PROMPTS]
        while engine.scheduler.has_work:
            engine.step()
        return [s.output_ids for s in sequences], steps, worker.step_limits, worker.graph.notes
    finally:
        worker.close()


@pytest.fixture(scope="module")
def uncut(tiny_model, tmp_path_factory):
    from conftest import Home
    return run(tiny_model, Home(tmp_path_factory.mktemp("uncut")), "libref")


def test_without_bounds_steps_take_the_configured_budget(uncut):
    outputs, steps, limits, _ = uncut
    assert limits == (16, 3) and max(tokens for tokens, _ in steps) == 16 and max(s for _, s in steps) == 3


def test_a_seq_chunk_bound_cuts_every_step(tiny_model, home, uncut):
    outputs, steps, limits, notes = run(tiny_model, home, "narrow", bound_m='RAD_CLE("M", 5)')
    assert limits == (5, 3), limits
    assert max(tokens for tokens, _ in steps) == 5, steps
    assert any(note.startswith("steps are cut at 5 tokens: node ") and "(gemm) has no row for M in [6, 16] "
               "(seq_chunk)" in note for note in notes), notes
    assert outputs == uncut[0]


def test_a_capacity_bound_holds_steps_to_that_many_sequences(tiny_model, home, uncut):
    outputs, steps, limits, notes = run(tiny_model, home, "narrow", bound_seqs='RAD_CLE("seqs", 2)')
    assert limits == (16, 2), limits
    assert max(seqs for _, seqs in steps) == 2, steps
    assert any("steps hold at most 2 sequences" in note and "(attention) has no row for seqs=3 (capacity)" in note
               for note in notes), notes
    assert outputs == uncut[0]


def test_a_hole_below_the_top_is_still_refused(tiny_model, home):
    from radiance.engine.selection.bands import SelectionError
    with pytest.raises(SelectionError, match=r"no library serves op 'gemm' for M in \[1, 2\]"):
        run(tiny_model, home, "narrow", bound_m='RAD_CGE("M", 3)')
