"""orchestra.runtime: Program, Method, interpreter, kernels, backends."""
