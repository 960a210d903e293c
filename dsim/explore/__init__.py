"""Front end: many runs of one scenario.  ``dsim sweep`` (grids and random samples), ``dsim
capacity`` (largest load or fewest replicas within the SLOs), ``dsim plan`` (the cheapest
deployment), oracle labels for the gamma head; points run on joblib, Dask or Ray as plain data."""
