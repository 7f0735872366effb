"""The control plane: everything that changes which weights the replicas serve.

- `lease`: one publisher at a time, across processes (the learner, `onthejob rollback`, the
  swap requests the admin API records);
- `fence`: the publisher's side of the swap gates (store/gates.py; proxy/upstream/gates.py is the
  proxy's side), which keep every proxy off a replica while its weights change;
- `publisher`, `lora_publisher`: the verified hot-swap of full weights or an adapter;
- `weight_check`, `vllm_weight_check`: the exact check that vLLM's kernels hold the
  checkpoint's weights (the second is loaded into vLLM's workers);
- `versions`: serve a recorded version again (rollback, promote);
- `requests`: carry out the swaps the admin API asked for through the store.
"""
