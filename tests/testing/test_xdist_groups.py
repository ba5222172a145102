"""The suite's own scheduling: under pytest-xdist a module's tests run on one worker."""
import pytest


@pytest.fixture
def nodeid(request):
    """The test's node id as a pytest-xdist worker of ``--dist loadgroup`` has it."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by a pytest-xdist worker with --dist loadgroup")
    return request.node.nodeid


def test_a_workers_tests_carry_their_modules_group(nodeid):
    # pytest-xdist's loadgroup schedules by the "@group" suffix of each node id; without it
    # (a pytest whose node ids the plugin cannot extend) every test goes to any worker and
    # both workers compile what each module needs
    assert nodeid.endswith("@tests/testing/test_xdist_groups.py"), nodeid


@pytest.mark.xdist_group("named")
def test_a_named_group_is_kept(nodeid):
    assert nodeid.endswith("@named"), nodeid
