# Put on PYTHONPATH, this folder makes `import torch` fail as it does in an environment without torch.
raise ModuleNotFoundError("No module named 'torch'", name="torch")
