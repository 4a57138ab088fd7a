"""brand_tf: the former name of brand.tf (``pip install brand``, then
``import brand.tf``), kept so that existing code keeps working."""

from brand.tf import BrandDataset, BuildError, dataset_fn, element_spec, load_ops, saved_state  # noqa: F401

__all__ = ["BrandDataset", "BuildError", "dataset_fn", "element_spec", "load_ops", "saved_state"]
