"""Fleets: replica pools, clusters, routers, admission, P/D disaggregation, controllers."""
