"""Continuous batching in the server (``batching: continuous``, the default for translators and
captioners): a request that arrives while another decodes joins the running search at its next
step (``batching: whole``: it waits for that batch to end); a running search that fails is run
again request by request; an input past its deadline is decoded no further."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from servers import SOURCES, TRANSLATION, client_for_app, concurrently, refused

from scratchformer.serve import Limits, ModelSpec, ServeConfig, create_app
from scratchformer.serve.served import load_served


def gated(model):
    """``model`` with its decoding held before its first step (a search's, or a whole batch's) until
    ``release`` is set; ``steps``: the texts decoded at each step of a running search, ``batches``:
    the texts of each whole batch."""
    model.started, model.release, model.steps, model.batches = threading.Event(), threading.Event(), [], []
    model.armed = False  # (not for the warm-up)
    session, run = model.session, model.run

    def hold() -> None:
        if model.armed and not model.started.is_set():
            model.started.set()
            model.release.wait(10)

    def gated_session(options, on_step=None):
        search = session(options, on_step)
        step = search.step

        def recorded():
            hold()
            if model.armed:
                model.steps.append(sorted(job.items[i] for job, i in search.tags))
            return step()

        search.step = recorded
        return search

    def gated_run(items, options, on_step=None):
        hold()
        if model.armed:
            model.batches.append(list(items))
        return run(items, options, on_step)

    model.session, model.run = gated_session, gated_run
    return model


def two_requests(batching: str):
    """ "ein Mann" is decoding (held at its first step) when "eine Frau" arrives."""
    model = gated(load_served(ModelSpec("de-en", str(TRANSLATION))))
    app = create_app(ServeConfig([model.spec], batching=batching, limits=Limits(max_wait_ms=1)), [model])
    answers = {}
    with client_for_app(app) as c:
        model.armed = True
        first = threading.Thread(
            target=lambda: answers.setdefault("a", c.post("/v1/translate", json={"inputs": "ein Mann"}))
        )
        first.start()
        assert model.started.wait(10)
        second = threading.Thread(
            target=lambda: answers.setdefault("b", c.post("/v1/translate", json={"inputs": "eine Frau"}))
        )
        second.start()
        batcher = app.state.serve.batchers["de-en"]
        deadline = time.monotonic() + 10
        while batcher.depth < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        model.release.set()
        first.join(30)
        second.join(30)
        model.armed = False
        alone = {t: c.post("/v1/translate", json={"inputs": t}).json()[0] for t in ("ein Mann", "eine Frau")}
    return model, answers, alone


@pytest.mark.machine  # answers compared with each input alone: on the other kind's kernels too
def test_a_request_that_arrives_while_another_decodes_joins_it_at_the_next_step() -> None:
    model, answers, alone = two_requests("continuous")
    assert model.steps[0] == ["ein Mann"] and model.steps[1] == ["ein Mann", "eine Frau"], model.steps[:3]
    assert model.batches == []
    for key, text in (("a", "ein Mann"), ("b", "eine Frau")):
        assert answers[key].json()[0]["translation_text"] == alone[text]["translation_text"]


@pytest.mark.machine  # answers compared with each input alone: on the other kind's kernels too
def test_whole_batching_makes_it_wait_for_the_batch_to_end() -> None:
    """The contrast (and the old path, kept for ``batching: whole``)."""
    model, answers, alone = two_requests("whole")
    assert model.steps == [] and model.batches[:2] == [["ein Mann"], ["eine Frau"]], model.batches
    assert answers["b"].json()[0]["translation_text"] == alone["eine Frau"]["translation_text"]


@pytest.mark.machine  # answers compared with each input alone: on the other kind's kernels too
def test_a_running_search_that_fails_is_run_again_request_by_request() -> None:
    model = load_served(ModelSpec("de-en", str(TRANSLATION)))
    session, run = model.session, model.run

    def failing_session(options, on_step=None):
        search = session(options, on_step)
        step = search.step

        def failing():
            if any(job.items[i] == "boom" for job, i in search.tags):
                raise ValueError("boom is not a text this model reads")
            return step()

        search.step = failing
        return search

    def failing_run(items, options, on_step=None):
        if "boom" in items:
            raise ValueError("boom is not a text this model reads")
        return run(items, options, on_step)

    model.session, model.run = failing_session, failing_run
    app = create_app(ServeConfig([model.spec], limits=Limits(max_wait_ms=200)), [model])
    with client_for_app(app) as c:
        texts = [SOURCES[0], "boom", SOURCES[1]]
        answers = __import__("asyncio").run(
            concurrently(app, [("/v1/translate", {"inputs": t}) for t in texts])
        )
        alone = [c.post("/v1/translate", json={"inputs": t}).json()[0] for t in (SOURCES[0], SOURCES[1])]
    assert [a.status_code for a in answers] == [200, 422, 200]
    assert "boom is not a text" in answers[1].json()["error"]
    for got, want in zip([answers[0].json()[0], answers[2].json()[0]], alone):
        # the same words; the scores to float rounding: a request that ended before "boom" joined
        # decoded beside the other one, its memory padded to the longer source
        assert (got["translation_text"], got["tokens"]) == (want["translation_text"], want["tokens"])
        assert got["score"] == pytest.approx(want["score"], rel=1e-5, abs=1e-6)
        assert [(h["text"], h["tokens"]) for h in got["nbest"]] == [
            (h["text"], h["tokens"]) for h in want["nbest"]
        ]


def test_an_input_past_its_deadline_is_decoded_no_further(tmp_path: Path) -> None:
    model = gated(load_served(ModelSpec("de-en", str(TRANSLATION))))
    app = create_app(ServeConfig([model.spec], limits=Limits(timeout_s=0.3)), [model])
    with client_for_app(app) as c:
        model.armed = True
        holder = threading.Thread(target=lambda: time.sleep(0.6) or model.release.set())
        holder.start()
        refused(c.post("/v1/translate", json={"inputs": "ein Mann"}), 504, "timeout_s")
        holder.join()
        time.sleep(0.3)
        assert (
            'scratchformer_dropped_inputs_total{model="de-en",reason="deadline"} 1.0'
            in c.get("/metrics").text
        )
    assert model.steps == [["ein Mann"]]  # the step it was in when its deadline passed, then no more


def test_batching_is_continuous_or_whole() -> None:
    with pytest.raises(
        ValueError, match=r"batching must be one of \('continuous', 'whole'\), got 'sometimes'"
    ):
        ServeConfig([ModelSpec("de-en", str(TRANSLATION))], batching="sometimes")
    assert ServeConfig([ModelSpec("de-en", str(TRANSLATION))]).batching == "continuous"


def test_once_an_input_fails_its_requests_other_inputs_are_computed_no_further() -> None:
    model = load_served(ModelSpec("de-en", str(TRANSLATION)))
    session = model.session

    def failing_session(options, on_step=None):
        search = session(options, on_step)
        join = search.join

        def failing(tags, items):
            if "boom" in items:
                raise ValueError("boom is not a text this model reads")
            return join(tags, items)

        search.join = failing
        return search

    model.session = failing_session
    app = create_app(ServeConfig([model.spec], limits=Limits(max_batch_size=1)), [model])
    with client_for_app(app) as c:
        refused(c.post("/v1/translate", json={"inputs": ["ein Mann", "boom", "eine Frau"]}), 422, "boom")
        time.sleep(0.3)
        metrics = c.get("/metrics").text
    assert 'scratchformer_dropped_inputs_total{model="de-en",reason="failed"} 1.0' in metrics
