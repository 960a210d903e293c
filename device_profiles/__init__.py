"""Device profiles (YAML): gpus.yaml (datacenter and workstation GPUs) and drafts/ (draft devices:
phones, laptops, edge GPUs; drafts/luts/: draft-side latency tables) and links/access.yaml (the
access-link classes a draft profile's default_link names).  This folder sits at the top of the repository and is installed as
the package ``dsim.device_profiles`` (setup.py maps it in, for wheels and editable installs alike);
dsim reads it with ``importlib.resources.files("dsim.device_profiles")``."""
