"""The test suite (a package, so its helpers import as tests.support; a dependency installs its own top-level tests package)."""
