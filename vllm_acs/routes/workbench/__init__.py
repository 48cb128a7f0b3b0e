"""The browser Workbench at /workbench: a static page, shipped in the package, on the public API."""
