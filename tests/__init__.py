"""autotune's tests: a package, so that every test module has a name of its own (tests.host.test_lock,
tests.e2e.test_deploy) and the shared helpers import as tests.support.*."""
