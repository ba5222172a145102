"""fluid.layers' distributions (``pdjit.layers.distributions``) against scipy.stats and
closed forms computed with NumPy matrices here; samples' shapes and ranges."""
import numpy as np
import pytest
from scipy import stats

import pdjit as fluid
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")


def test_distributions_against_scipy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        L = fluid.layers
        value = fluid.data("value", [3], "float32")
        u = L.Uniform([0.0, 1.0, -2.0], [1.0, 3.0, 2.0])
        n1 = L.Normal([0.0, 1.0, -1.0], [1.0, 0.5, 2.0])
        n2 = L.Normal(fluid.data("loc2", [3], "float32"), [2.0, 1.0, 0.5])
        c1 = L.Categorical([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
        c2 = L.Categorical([[0.5, 0.5, 1.0], [2.0, 0.0, 1.0]])
        m1 = L.MultivariateNormalDiag([0.0, 1.0], np.diag([1.0, 2.0]))
        m2 = L.MultivariateNormalDiag([1.0, -1.0], np.diag([0.5, 3.0]))
        outs = [u.entropy(), u.log_prob(value), u.sample([4], seed=3),
                n1.entropy(), n1.log_prob(value), n1.kl_divergence(n2), n1.sample([5], seed=2),
                c1.entropy(), c1.kl_divergence(c2), m1.entropy(), m1.kl_divergence(m2)]
    v = np.array([0.5, 3.5, 0.1], np.float32)
    loc2 = np.array([1.0, 0.0, 0.5], np.float32)
    got = Executor().run(main, feed={"value": v, "loc2": loc2}, fetch_list=outs, scope=Scope())
    lo, hi = np.array([0.0, 1.0, -2.0]), np.array([1.0, 3.0, 2.0])
    mu, sd = np.array([0.0, 1.0, -1.0]), np.array([1.0, 0.5, 2.0])
    sd2 = np.array([2.0, 1.0, 0.5])
    with np.errstate(divide="ignore"):
        u_lp = np.where((v > lo) & (v < hi), -np.log(hi - lo), -np.inf)
    kl_n = np.log(sd2 / sd) + (sd ** 2 + (mu - loc2) ** 2) / (2 * sd2 ** 2) - 0.5
    l1, l2 = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]]), np.array([[.5, .5, 1.], [2., 0., 1.]])
    p1 = np.exp(l1) / np.exp(l1).sum(1, keepdims=True)
    p2 = np.exp(l2) / np.exp(l2).sum(1, keepdims=True)
    s0, s1 = np.diag([1.0, 2.0]), np.diag([0.5, 3.0])
    d = np.array([1.0, -2.0])
    kl_m = 0.5 * (np.trace(np.linalg.inv(s1) @ s0) + d @ np.linalg.inv(s1) @ d - 2
                  + np.log(np.linalg.det(s1) / np.linalg.det(s0)))
    want = {0: np.log(hi - lo), 1: u_lp, 3: stats.norm(mu, sd).entropy(),
            4: stats.norm(mu, sd).logpdf(v), 5: kl_n,
            7: stats.entropy(p1, axis=1).reshape(2, 1),
            8: stats.entropy(p1, p2, axis=1).reshape(2, 1),
            9: stats.multivariate_normal([0, 1], s0).entropy(), 10: kl_m}
    for k, w in want.items():
        np.testing.assert_allclose(np.asarray(got[k]).reshape(np.shape(w)), w, rtol=1e-5,
                                   err_msg=f"output {k}")
    samples_u, samples_n = got[2], got[6]
    assert samples_u.shape == (4, 3) and ((samples_u >= lo) & (samples_u < hi)).all()
    assert samples_n.shape == (5, 3) and np.isfinite(samples_n).all()
