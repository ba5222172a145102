"""Fixtures of the cpu target's kernel tests."""
import pytest


@pytest.fixture
def team_loops(monkeypatch):
    """Parallel loops (``lib.team``) compiled at their first ask, as warmup compiles them
    ahead, and every ``team.run`` recorded: the list of ``(loop, its last argument, whether
    it ran)``."""
    from pdjit.codegen.cpu.lib import team

    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "COMPILE", True)
    monkeypatch.setattr(team, "_READY", {})  # (no loop left waiting by an earlier test)
    ran = []
    real = team.run

    def run(loop, call):
        done = real(loop, call)
        ran.append((loop, call[-1], done))
        return done

    monkeypatch.setattr(team, "run", run)
    return ran
