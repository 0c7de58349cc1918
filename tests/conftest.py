

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a whole campaign in a subprocess (tens of seconds)")
