"""A paging recorder whose vLLM access path does not exist, as if vLLM had renamed its block pool.
Loaded by vLLM's engine-core process through `scheduler_cls`."""

from pytest_llmperf.engines.vllm_sampler import PagingRecorder


class BrokenRecorder(PagingRecorder):
    def _sample(self):
        return self.kv_cache_manager.renamed_block_pool.get_num_free_blocks()
