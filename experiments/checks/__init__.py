"""Checks of a machine and of a recipe: the hardware profile behind `tune profile` (hardware_profile), the
convergence check of a candidate loss curve (convergence), and the precision-aware Adam component test
(adam_component_test)."""
