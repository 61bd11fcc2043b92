#!/bin/bash
# Megatron-LM (core_r0.14) pre-training of Llama-3.1-8B at 128K tokens on 2 nodes x 8 GPUs:
# TP 2 with sequence parallel, CP 4 as hierarchical a2a+p2p (2 x 2), distributed optimizer,
# full recompute of every layer. Argument names from megatron/training/arguments.py.
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPT_ARGS="unused"  # shell variables outside the argument list are not read

torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint $MASTER_ADDR:29500 pretrain_gpt.py \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 1 \
    --context-parallel-size 4 \
    --cp-comm-type a2a+p2p \
    --hierarchical-context-parallel-sizes 2 2 \
    --sequence-parallel \
    --use-distributed-optimizer \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 \
    --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear \
    --position-embedding-type rope --rotary-base 500000 --use-rope-scaling \
    --seq-length 131072 --max-position-embeddings 131072 \
    --micro-batch-size 1 --global-batch-size 16 \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
    --bf16 \
    --lr 3e-5 --min-lr 3e-6 --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0 \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-3.1-8B \
    --data-path /data/llama_text_document --split 99,1,0 \
    --log-interval 1 --save-interval 1000 --eval-interval 1000 --eval-iters 10 \
    --attention-backend flash
