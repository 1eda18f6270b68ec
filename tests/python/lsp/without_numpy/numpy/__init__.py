# Put on PYTHONPATH, this folder makes `import numpy` fail: a server that imports it where it needs none fails.
raise ModuleNotFoundError("No module named 'numpy'", name="numpy")
