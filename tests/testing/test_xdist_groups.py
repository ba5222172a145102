"""The suite's own scheduling: under pytest-xdist a module's tests run on one worker."""
import pytest


def test_a_workers_tests_carry_their_modules_group(request):
    # pytest-xdist's loadgroup schedules by the "@group" suffix of each node id; without it
    # (a pytest whose node ids the plugin cannot extend) every test goes to any worker and
    # both workers compile what each module needs
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by a pytest-xdist worker with --dist loadgroup")
    assert request.node.nodeid.endswith("@tests/testing/test_xdist_groups.py"), request.node.nodeid


@pytest.mark.xdist_group("named")
def test_a_named_group_is_kept(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by a pytest-xdist worker with --dist loadgroup")
    assert request.node.nodeid.endswith("@named"), request.node.nodeid
