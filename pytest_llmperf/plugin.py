"""pytest hooks and registration; every hook hands its work to the module named for it.

A limit marker is validated before the test runs (bad input errors without spending a workload),
the test body records results through the `llmperf` fixture (fixtures.py), and the test is judged in
`pytest_runtest_makereport` (judging.py): a violation fails that test's report, as pytest-memray's
limit markers do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest

from . import activation, judging, markers, options, properties, pytest_benchmark_bridge, selection, soak
from .baseline import folder_for
from .engines import registry
from .fixtures import (  # noqa: F401 - pytest finds a plugin's fixtures in its module
    check_server,
    engine_fixtures,
    gpu_fixture,
    llm_engine,
    llmperf,
    llmperf_session,
    server_log_on_failure,
    vllm_server,
)
from .gpu import machine_class
from .report import TestRecord, terminal_lines
from .report import write as write_report
from .session import PERF, SESSION, Session


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add(parser)


def pytest_configure(config: pytest.Config) -> None:
    hardware = options.hardware_override(config) or machine_class()
    for line in markers.catalogue(hardware):
        config.addinivalue_line("markers", line)
    engines = registry.discover()
    state = config.stash[SESSION] = options.session(config, hardware, engines)
    # `<name>_engine` and `<name>_engine_factory` for every registered engine, the built-in ones too
    config.pluginmanager.register(engine_fixtures(engines), "llmperf-engine-fixtures")
    config.pluginmanager.register(RecordCollector(state), "llmperf-records")
    rounds, limit_mib = options.soak_rounds(config)
    if rounds > 1:  # the plugin is then active whatever the tests use, once they are collected (its GPUs sized by them)
        soak.host_memory_mib()  # psutil missing: a usage error now, not at every test's setup
        config.pluginmanager.register(soak.Soak(rounds, limit_mib, lambda: state.gpu.index if state.gpu else None),
                                      soak.PLUGIN_NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    activation.deactivate(config)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    with session.config.stash[SESSION].pool.times.timed("collection"):
        return (yield)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the hardware marker must be there to be selected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if activation.in_use(config, items):
        activation.activate(config, items)
    config.stash[selection.CARRIED] = selection.mark_hardware(items, config.stash[SESSION].hardware)
    # Tests that share an engine configuration run together, so each engine starts once (per soak round).
    state = config.stash[SESSION]
    order = selection.engine_order(items, in_process_last=bool(state.gpus), beside_last=state.starts_side_by_side,
                                   engine_name=state.engine_name, engines=set(state.engines), model_spec=state.model_spec)
    items.sort(key=lambda item: (soak.round_of(item), order[item.nodeid]))
    properties.apply_profile([i for i in items if selection.uses_plugin(i)], config)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # pytest reads only pytest_* names
def pytest_collection_modifyitems_selected(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After `-k` and `-m` deselected: activation again, for the tests selected. None of them using the plugin,
    the session gets back what it changed (a worker's CUDA_VISIBLE_DEVICES, SIGTERM's handler); otherwise each
    worker claims as many GPUs as the selected tests' engines spread over, not the deselected ones'."""
    activation.undo(config)
    if activation.in_use(config, items):
        activation.activate(config, items)


def pytest_report_header(config: pytest.Config) -> str | None:
    """What this session will measure and judge against, before any engine starts: an empty or foreign
    baseline store is visible at once, not after an hour of GPU time. Silent in a project that shows no
    sign of using the plugin (no baseline folder, no llmperf option or ini value)."""
    state = config.stash[SESSION]
    gate = state.gate
    if not (gate.root.is_dir() or options.asked(config)):
        return None
    folder = folder_for(gate.root, gate.hardware, gate.model)
    stored = len(list(folder.glob("*.json"))) if folder.is_dir() else 0
    where = folder.relative_to(config.rootpath) if folder.is_relative_to(config.rootpath) else folder
    others = sorted(p.name for p in gate.root.iterdir() if p.is_dir()) if gate.root.is_dir() else []
    elsewhere = f" (classes stored: {', '.join(others)})" if not stored and others else ""
    return (f"llmperf: engine {state.engine_name}, model {state.model_spec}, hardware {state.hardware}, "
            f"baseline {gate.mode}: {stored} stored in {where}/{elsewhere}")


def pytest_collection_finish(session: pytest.Session) -> None:
    # the tests that will run, in their order (after -m and -k): which engines may start together
    state = session.config.stash[SESSION]
    if state.starts_side_by_side:
        groups = selection.side_by_side_groups(session.items, state.engine_name, set(state.engines), state.hardware,
                                               state.model_spec)
        state.plan_side_by_side(groups)


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    lines = (selection.empty_selection_line(config, items), selection.stored_baselines_line(config, items))
    return [line for line in lines if line]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    activation.exit_if_terminated(item.session)  # a SIGTERM swallowed: no next test, no engine started for it
    result = yield
    activation.exit_if_terminated(item.session)
    return result


@pytest.hookimpl(tryfirst=True)  # before fixtures: no engine starts for a test with a bad marker
def pytest_runtest_setup(item: pytest.Item) -> None:
    selection.skip_other_hardware(item)
    claim_error = activation.claim_error(item.config)
    if claim_error and selection.uses_plugin(item):
        pytest.fail(f"llmperf: {claim_error}", pytrace=False)
    check_server(item)
    judging.check_inputs(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    if call.when == "setup" and report.failed and (unreadable := judging.unreadable_baseline_record(item)):
        report.llmperf_record = asdict(unreadable)  # errored before its body, still counted with the baselines
    if call.when != "call":
        return report
    try:
        with item.config.stash[SESSION].pool.times.timed("judging"):
            _judge_report(item, report, call)
    except pytest.exit.Exception:
        if not activation.was_terminated(item.config):
            raise  # another pytest.exit: as pytest would
        # SIGTERM while judging: this test unjudged, the session ends after it
        report.outcome = "failed"
        report.longrepr = f"llmperf: {item.nodeid}: not judged: the session was terminated (SIGTERM) while judging it"
    except Exception as e:  # an input no check foresaw, or a fault of the plugin: this test fails, the session goes on
        report.outcome = "failed"
        report.longrepr = (f"llmperf: {item.nodeid}: could not judge this test ({type(e).__name__}: {e}); the other "
                           "tests of the session are judged as usual")
    return report


def _judge_report(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None]) -> None:
    """The verdict of a test whose body passed (property tests judge every example inline), on its
    report; its record travels with the report, so that under pytest-xdist the controller sees every
    worker's results."""
    perf = item.stash.get(PERF, None)
    if perf is not None:
        item.user_properties.extend(judging.junit_properties(perf))  # junitxml reads the teardown report's copy
    judgement = judging.Judgement()
    if report.failed and call.excinfo is not None and properties.broke_a_limit(call.excinfo.value):
        report.llmperf_failed = True  # a property test judges its limits in its body: PERF-FAILED as any other
    elif report.failed and call.excinfo is not None and properties.broke_a_limit(call.excinfo.value,
                                                                                   properties.PerfExampleInvalid):
        report.llmperf_invalid = True  # and its examples' validity: PERF-INVALID
    if report.passed and not properties.is_property_test(item):
        judgement = judging.judge(item, perf)
        if judgement.failure is not None:
            report.outcome = "failed"
            report.longrepr = judgement.failure
            report.llmperf_failed = judgement.kind == "perf"
            report.llmperf_invalid = judgement.kind == "invalid"
    server_log_on_failure(item, report)
    notes = list(judgement.notes)
    if perf is not None and (perf.results or judgement.verdict is not None):  # a baseline it produced nothing of
        report.llmperf_record = asdict(judging.record(item, perf, report.outcome, judgement))
        pytest_benchmark_bridge.add(item, perf)
    report.sections.extend(notes)


def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, Any] | None:
    if report.when == "call" and getattr(report, "llmperf_invalid", False):
        return "failed", "I", ("PERF-INVALID", {"yellow": True})
    if report.when == "call" and getattr(report, "llmperf_failed", False):
        return "failed", "P", ("PERF-FAILED", {"red": True})
    return None


class RecordCollector:
    """Collects test records from reports where they are logged: in the test process, or under
    pytest-xdist in the controller, which receives every worker's reports."""

    def __init__(self, state: Session) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, "llmperf_record", None)
        if record is not None and report.when in ("setup", "call"):
            self.state.records.append(TestRecord(**record))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(SESSION, None)
    if state is not None:
        try:
            state.pool.close()
        except Exception as e:  # noqa: BLE001 - the verdicts, the summary and the report still come; the job fails
            state.stop_error = f"{type(e).__name__}: {e}"
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        state.picture_errors += judging.draw_pictures(state)
        if activation.is_active(session.config):  # a session that never used the plugin keeps its output
            activation.show_engine_output(session.config)
        activation.summarize_if_terminated(session.config, exitstatus)
        if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: its times go to the controller
            session.config.workeroutput["llmperf_times"] = state.own_times()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist, in the controller: a finished worker's time to verdict, for the summary line."""
    state = node.config.stash.get(SESSION, None)
    times = getattr(node, "workeroutput", {}).get("llmperf_times")
    if state is not None and times:
        state.worker_times.append(times)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(SESSION, None)
    if state is not None and state.stop_error:
        terminalreporter.write_line(f"llmperf: the engines did not stop cleanly at the session's end ({state.stop_error}); "
                                    "the session fails so that the next job does not meet what they left", red=True)
    if state is None:
        return
    tr = terminalreporter
    if state.records:
        tr.section("llmperf")
        for line in terminal_lines(state.records):
            tr.write_line(line)
        tr.write_line(f"engines started: {state.engine_starts()}; hardware class: {state.hardware}; model: {state.model_spec}")
        tr.write_line(state.time_line())
    if state.picture_errors:
        tr.write_line(f"llmperf plots: {len(state.picture_errors)} not drawn, e.g. {state.picture_errors[0]}", yellow=True)
    # a session that measured nothing still writes its report: an older run's results.json left in the folder
    # would be read (and uploaded by CI) as this run's
    if state.report_dir is not None and not hasattr(config, "workerinput"):  # xdist: the controller writes
        try:
            paths = write_report(state.report_dir, state.records, state.describe())
        except OSError as e:  # the folder went away or filled up since the start: say so, keep pytest's summary
            tr.write_line(f"llmperf report: not written to {state.report_dir} ({e})", red=True)
        else:
            tr.write_line("llmperf report: " + ", ".join(str(p) for p in paths))
