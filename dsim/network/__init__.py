"""Network layer: NetworkX topologies and a fluid, fair-shared transfer model on SimPy."""
