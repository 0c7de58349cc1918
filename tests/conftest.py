import os

from hypothesis import HealthCheck, settings

# Property tests are plain Hypothesis tests; profiles keep them quick by default
# and let a nightly job turn them up without editing code.
settings.register_profile("default", max_examples=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("nightly", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("VMFUZZ_HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a whole campaign in a subprocess (tens of seconds)")
