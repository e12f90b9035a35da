"""slime custom generate functions: the black-box agent dispatch and its parts.

--custom-generate-function-path dressage.rollout.generate.blackbox_dispatch.generate
"""
