// ctxplan import/export for Megatron-LM, torchtitan, DeepSpeed and ArcticTraining (planner/stacks.hpp).
// Properties: export then import gives back the same plan for every CP kind and option a stack
// supports; real-format configurations (written from each stack's documented option names) map to
// the plan keys their documentation implies; what a stack cannot express is listed; options that
// change the answer and cannot be modelled are refused naming the option; unknown options are warned.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "costmodel/errors.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_capabilities.hpp"
#include "planner/stacks.hpp"
#include "tests/run_process.hpp"

namespace fs = std::filesystem;
using namespace ctx;

namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

std::string data(const std::string& name) { return std::string(CTXPLAN_TEST_DATA) + "/stacks/" + name; }
std::string slurp(const std::string& path) { return ctx::testing::slurp(path); }

// Llama-3.1-8B on 2 nodes x 8 GPUs; dp filled from tp and cp.
ExportJob job_for(const std::string& plan_text, int64_t nodes = 2, int64_t gpus = 8) {
  ExportJob j;
  j.model = resolve_model(profiles(), "Llama-3.1-8B");
  j.model_arg = "Llama-3.1-8B";
  j.seq = 131072;
  j.nodes = nodes;
  j.gpus_per_node = gpus;
  j.plan = parse_plan(plan_text, "test");
  if (j.plan.dp == 0) j.plan.dp = nodes * gpus / (j.plan.tp * j.plan.cp);
  return j;
}

StackJob reimport(Stack s, const StackExport& e, const ExportJob& j) {
  ImportOptions o;
  o.world = j.nodes * j.gpus_per_node;
  return import_stack(s, e.text, "export", profiles(), o);
}

// A build without toml++ or yaml-cpp cannot read torchtitan or ArcticTraining files (CI has both).
bool readable(Stack s) {
#if !CTXPLAN_HAVE_TOML
  if (s == Stack::torchtitan) return false;
#endif
#if !CTXPLAN_HAVE_YAML
  if (s == Stack::arctic) return false;
#endif
  (void)s;
  return true;
}
#define SKIP_UNLESS_READABLE(s) \
  if (!readable(s)) GTEST_SKIP() << "built without the " << to_string(s) << " file reader"

void expect_round_trip(Stack s, const std::vector<std::string>& plans) {
  for (const std::string& text : plans) {
    SCOPED_TRACE(std::string(to_string(s)) + ": " + text);
    ExportJob j = job_for(text);
    StackExport e = export_stack(s, j, profiles());
    EXPECT_TRUE(e.cannot_express.empty()) << stacks::join(e.cannot_express, "\n");
    StackJob back = reimport(s, e, j);
    EXPECT_TRUE(same_plan(j.plan, back.plan)) << stacks::join(plan_differences(j.plan, back.plan), "; ") << "\n" << e.text;
    EXPECT_TRUE(same_plan(j.plan, e.exported));
    if (s != Stack::deepspeed) {  // a DeepSpeed config names neither the model nor the sequence
      EXPECT_EQ(back.model, "Llama-3.1-8B");
      EXPECT_EQ(back.seq, 131072);
    }
  }
}

std::string import_error(Stack s, const std::string& text, int64_t world = 16) {
  ImportOptions o;
  o.world = world;
  try {
    import_stack(s, text, "cfg", profiles(), o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
  for (const auto& s : v)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

// ---- export -> import round trips -------------------------------------------------------------

TEST(StackRoundTrip, MegatronKeepsEveryCpKindAndOption) {
  expect_round_trip(Stack::megatron,
                    {"cp=1", "tp=8", "tp=2,sp=0", "cp=16,cp_kind=zigzag", "cp=4,cp_kind=allgather", "cp=8,cp_kind=ulysses",
                     "tp=2,cp=4,cp_kind=usp,ulysses=2", "cp=8,cp_kind=usp,ulysses=4", "zero=1,cp=2", "zero=2,cp=2",
                     "zero=3,cp=4,cp_kind=allgather", "recompute=selective,tp=4", "recompute=full,ckpt_offload=1,cp=8",
                     "zero=1,opt_offload=1", "mbs=2,ga=4,tp=2", "precision=fp32", "precision=fp8,tp=2",
                     "zero=1,zero_shard=8", "zero=1,cp=2,zero_shard=4", "tp=4,tp_overlap=1", "precision=fp8,tp=2,cp=2,tp_overlap=1",
                     // uneven pipeline splits (arguments.py: --decoder-first/last-pipeline-num-layers with
                     // --num-virtual-stages-per-pipeline-rank; --account-for-embedding/loss-in-pipeline-split)
                     "tp=2,pp=4,dp=2,ga=8,pp_first=2,pp_last=6", "pp=4,vpp=2,dp=4,ga=8,pp_first=6,pp_last=6",
                     "pp=2,dp=8,ga=4,pp_embed=1,pp_loss=1", "pp=4,vpp=2,dp=4,ga=8"});
}

TEST(StackRoundTrip, TorchtitanKeepsEveryCpKindAndOption) {
  SKIP_UNLESS_READABLE(Stack::torchtitan);
  expect_round_trip(Stack::torchtitan,
                    {"zero=0", "zero=3", "zero=2,cp=2", "tp=4,zero=3", "cp=8,cp_kind=zigzag,zero=3",
                     "cp=4,cp_kind=allgather,zero=3", "tp=2,cp=2,zero=3,recompute=selective", "zero=3,recompute=full",
                     "zero=3,opt_offload=1,param_offload=1", "zero=3,mbs=2,ga=3", "zero=3,precision=fp32",
                     "zero=3,precision=fp8,tp=2", "zero=3,zero_shard=8", "cp=2,zero=3,zero_shard=4", "zero=2,zero_shard=8",
                     // FSDP under pipeline stages is zero=1 (stack_torchtitan.cpp); 32 layers over 2 stages is
                     // torchtitan's weighted split too: (32 + 2) / 2 = 17 each, minus the embedding / the output
                     "dp=8,pp=2,zero=1,ga=4", "dp=4,tp=2,pp=2,zero=1,mbs=2,ga=3,recompute=full", "dp=8,pp=2,zero=1,zero_shard=4,ga=2",
                     // [training] compile = true at 000204a4 compiles the blocks and the loss
                     "zero=3,recompute=selective,compile=model+loss"});
}

TEST(StackRoundTrip, DeepSpeedKeepsEveryOptionItsConfigHolds) {
  expect_round_trip(Stack::deepspeed,
                    {"zero=0", "zero=1", "zero=2", "zero=3", "zero=2,opt_offload=1", "zero=3,opt_offload=1,param_offload=1",
                     "zero=3,mbs=4,ga=2", "zero=3,recompute=full,ckpt_offload=1", "zero=1,precision=fp32",
                     "zero=3,zero_shard=8"});
}

TEST(StackRoundTrip, ArcticKeepsEveryCpKindAndOption) {
  SKIP_UNLESS_READABLE(Stack::arctic);
  expect_round_trip(Stack::arctic,
                    {"zero=3,recompute=full", "cp=8,cp_kind=ulysses,zero=3,recompute=full",
                     "cp=16,cp_kind=ulysses,zero=3,recompute=full,ckpt_offload=1,opt_offload=1,tiled_mlp=auto,tiled_loss=4096",
                     "cp=2,cp_kind=ulysses,zero=2,recompute=none", "zero=3,param_offload=1,opt_offload=1,recompute=full",
                     "zero=1,recompute=full,mbs=2,ga=4", "zero=0,recompute=full,precision=fp32"});
}

// ---- what a stack cannot express is listed, and the file says what it runs instead --------------

TEST(StackExport, ListsWhatTheStackCannotExpress) {
  SKIP_UNLESS_READABLE(Stack::torchtitan);
  SKIP_UNLESS_READABLE(Stack::arctic);
  struct Case {
    Stack stack;
    std::string plan, key;
  } cases[] = {
      {Stack::megatron, "cp=4,cp_kind=ring", "cp_kind=ring"},
      {Stack::megatron, "zero=3,param_offload=1", "param_offload"},
      {Stack::megatron, "cp=2,tiled_loss=4096", "tiled_loss"},
      {Stack::torchtitan, "cp=8,cp_kind=ulysses,zero=3", "cp_kind=ulysses"},
      {Stack::torchtitan, "zero=1", "zero=1"},
      {Stack::torchtitan, "dp=8,pp=2,zero=0,ga=4", "DDP has not supported"},
      {Stack::torchtitan, "dp=4,tp=4,zero=0", "DDP has not supported"},
      {Stack::torchtitan, "zero=3,ckpt_offload=1,recompute=full", "ckpt_offload"},
      {Stack::torchtitan, "zero=3,compile=model", "compile=model"},  // 000204a4's compile compiles the loss too
      {Stack::deepspeed, "tp=2,zero=1", "tp=2"},
      {Stack::deepspeed, "cp=8,cp_kind=ulysses,zero=3", "cp=8"},
      {Stack::arctic, "cp=8,cp_kind=zigzag,zero=3,recompute=full", "cp_kind=zigzag"},
      {Stack::arctic, "tp=2,zero=3,recompute=full", "tp=2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.stack)) + ": " + c.plan);
    ExportJob j = job_for(c.plan);
    StackExport e = export_stack(c.stack, j, profiles());
    EXPECT_TRUE(any_contains(e.cannot_express, c.key)) << stacks::join(e.cannot_express, "\n");
    // and the plan the written file really runs is what import reads back
    EXPECT_FALSE(same_plan(j.plan, e.exported));
    EXPECT_TRUE(same_plan(reimport(c.stack, e, j).plan, e.exported));
  }
}

// ---- real-format configurations map to the plan their documentation implies -------------------

TEST(StackImport, MegatronLaunchScriptMapsToDocumentedPlan) {
  // torchrun --nnodes 2 --nproc_per_node 8: 16 GPUs; TP 2 x CP 4 -> DP 2; global 16 / (micro 1 x DP 2) = 8
  // accumulation steps; a2a+p2p with hierarchical sizes 2 2 = Ulysses 2 inside a ring of 2;
  // --use-distributed-optimizer = ZeRO-1; --sequence-parallel on.
  StackJob j = import_stack(Stack::megatron, slurp(data("megatron_llama3_8b_128k.sh")), "megatron", profiles());
  EXPECT_TRUE(same_plan(j.plan, parse_plan("dp=2,tp=2,sp=1,cp=4,cp_kind=usp,ulysses=2,zero=1,ga=8,recompute=full")))
      << plan_to_string(j.plan);
  EXPECT_EQ(j.model, "Llama-3.1-8B");
  EXPECT_EQ(j.seq, 131072);
  EXPECT_EQ(j.world, 16);
  EXPECT_EQ(j.runtime, "megatron");
  EXPECT_TRUE(any_contains(j.warnings, "--attention-backend flash"));  // not modelled: warned, not dropped
  EXPECT_TRUE(any_contains(j.ignored, "--lr 3e-5"));
}

TEST(StackImport, MegatronDefaultsFollowArgumentsPy) {
  // p2p is the default --cp-comm-type; sequence parallel is off unless asked for; no precision flag = fp32
  StackJob j = import_stack(Stack::megatron,
                            "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
                            "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
                            "--untie-embeddings-and-output-weights --seq-length 8192 --tensor-model-parallel-size 2 "
                            "--context-parallel-size 2 --micro-batch-size 1",
                            "args", profiles());
  EXPECT_TRUE(same_plan(j.plan, parse_plan("dp=0,tp=2,sp=0,cp=2,cp_kind=zigzag,precision=fp32"))) << plan_to_string(j.plan);
  EXPECT_EQ(j.model, "Llama-3.1-8B");
}

TEST(StackImport, MegatronTpCommOverlapIsThePlanKey) {
  // --tp-comm-overlap (Transformer Engine userbuffers) is tp_overlap=1; without it, 0; its YAML
  // configuration is warned (the runtime profile's is priced, not the file's)
  const std::string shape = "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
                            "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
                            "--untie-embeddings-and-output-weights --seq-length 8192 --tensor-model-parallel-size 4 "
                            "--sequence-parallel --micro-batch-size 1 --bf16";
  StackJob on = import_stack(Stack::megatron, shape + " --tp-comm-overlap --tp-comm-overlap-cfg ub.yaml", "args", profiles());
  EXPECT_TRUE(on.plan.tp_overlap);
  EXPECT_TRUE(any_contains(on.warnings, "--tp-comm-overlap-cfg ub.yaml"));
  EXPECT_FALSE(any_contains(on.warnings, "--tp-comm-overlap:"));  // read, not "not modelled"
  StackJob off = import_stack(Stack::megatron, shape, "args", profiles());
  EXPECT_FALSE(off.plan.tp_overlap);
}

TEST(StackExport, TpOverlapIsListedWhereTheStackHasNoFlagForIt) {
  // torchtitan's async TP (micro-pipelined TP on symmetric memory) is another mechanism: not written for it
  SKIP_UNLESS_READABLE(Stack::torchtitan);
  StackExport e = export_stack(Stack::torchtitan, job_for("tp=4,tp_overlap=1"), profiles());
  EXPECT_TRUE(any_contains(e.cannot_express, "tp_overlap")) << stacks::join(e.cannot_express, "\n");
}

TEST(StackImport, MegatronShapeWithoutProfileBecomesModelSpec) {
  StackJob j = import_stack(Stack::megatron,
                            "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --swiglu --vocab-size 32000 "
                            "--seq-length 4096 --bf16",
                            "args", profiles());
  ASSERT_TRUE(j.model_spec.has_value());
  EXPECT_EQ(j.model_spec->layers, 4);
  EXPECT_EQ(j.model_spec->ffn, (4 * 512 * 2 / 3) / 64 * 64);  // arguments.py's SwiGLU default
  EXPECT_EQ(j.model_spec->vocab, 32000);
  EXPECT_TRUE(j.model_spec->tied_embeddings);
}

TEST(StackImport, TorchtitanTomlMapsToDocumentedPlan) {
  SKIP_UNLESS_READABLE(Stack::torchtitan);
  // shard -1 = the leftover ranks: 16 / (cp 8) = 2; FSDP over dp_shard x cp = zero=3; alltoall rotation
  // = load-balanced ring (zigzag); global 4 / (local 1 x dp 2) = 2 accumulation steps.
  ImportOptions o;
  o.world = 16;
  StackJob j = import_stack(Stack::torchtitan, slurp(data("torchtitan_llama3_8b_cp8.toml")), "tt", profiles(), o);
  EXPECT_TRUE(same_plan(j.plan, parse_plan("dp=2,cp=8,cp_kind=zigzag,zero=3,ga=2,recompute=full"))) << plan_to_string(j.plan);
  EXPECT_EQ(j.model, "Llama-3.1-8B");
  EXPECT_EQ(j.seq, 131072);
  EXPECT_TRUE(any_contains(j.warnings, "float8.enable_fsdp_float8_all_gather"));
  // priced with torchtitan's own runtime profile (profiles/runtimes/torchtitan.json), no stand-in
  EXPECT_EQ(j.runtime, "torchtitan");
  EXPECT_NO_THROW(resolve_runtime(profiles(), j.runtime));
  EXPECT_FALSE(any_contains(j.warnings, "runtime profile"));
}

TEST(StackImport, TorchtitanPipelineStagesMapToZeroOneAndItsWeightedSplit) {
  SKIP_UNLESS_READABLE(Stack::torchtitan);
  // torchtitan/distributed/pipeline.py generate_module_names_per_stage: the embedding and the output
  // weigh one layer each; (L + 2) / S per virtual stage, the first (L + 2) % S stages one more, the
  // first and last stage one transformer layer fewer. By hand:
  //  - 405B (126 layers), pp=8, 1F1B: 128 / 8 = 16 -> 15, 16 x 6, 15 = Megatron's pp_embed=1,pp_loss=1
  //  - 8B (32 layers), pp=3: 34 / 3 = 11 r 1 -> 11 (12 - 1), 11, 10 (11 - 1) = pp_first=11,pp_last=10
  //  - 70B (80 layers), pp=4: 82 / 4 = 20 r 2 -> 20, 21, 20, 19: no ctxplan split; 80 / 4 = 20 even, warned
  // FSDP under pipelining keeps the stage unsharded through the step: zero=1. local_batch_size 8 in
  // micro-batches of 2 = 4 per schedule step, x global 64 / (8 x dp 2 or 4) accumulation steps.
  struct Case {
    const char* flavor;
    int64_t world, pp;
    const char* plan;
    const char* warning;  // "" = the split is exact
  } cases[] = {
      {"405B", 128, 8, "dp=2,tp=8,pp=8,zero=1,mbs=2,ga=16,pp_embed=1,pp_loss=1,recompute=full", ""},
      {"8B", 12, 3, "dp=4,pp=3,zero=1,mbs=2,ga=8,pp_first=11,pp_last=10,recompute=full", ""},
      {"70B", 64, 4, "dp=2,tp=8,pp=4,zero=1,mbs=2,ga=16,recompute=full", "20, 21, 20, 19"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flavor);
    ImportOptions o;
    o.world = c.world;
    const std::string tp = std::string(c.flavor) == "8B" ? "1" : "8";
    const std::string toml = std::string("[model]\nname = \"llama3\"\nflavor = \"") + c.flavor +
                             "\"\n[training]\nlocal_batch_size = 8\nglobal_batch_size = 64\n[parallelism]\ntensor_parallel_degree = " + tp +
                             "\npipeline_parallel_degree = " + std::to_string(c.pp) +
                             "\npipeline_parallel_microbatch_size = 2\n[activation_checkpoint]\nmode = \"full\"\n";
    const StackJob j = import_stack(Stack::torchtitan, toml, "tt", profiles(), o);
    EXPECT_TRUE(same_plan(j.plan, parse_plan(c.plan))) << plan_to_string(j.plan);
    EXPECT_TRUE(any_contains(j.warnings, "modelled as zero=1"));
    EXPECT_EQ(any_contains(j.warnings, "pipeline split"), *c.warning != 0);
    if (*c.warning) {
      EXPECT_TRUE(any_contains(j.warnings, c.warning));
    }
    // the runtime runs what the import produced
    const RuntimeProfile rt = resolve_runtime(profiles(), j.runtime);
    EXPECT_EQ(missing_capability(rt.capabilities, rt.name, j.plan), "");
  }
  // Interleaved1F1B: two stages per rank by default; 8B over 2 x 2 = 4 virtual stages is 8, 9, 8, 7
  ImportOptions o;
  o.world = 8;
  const StackJob j = import_stack(Stack::torchtitan,
                                  "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nlocal_batch_size = 4\n[parallelism]\n"
                                  "pipeline_parallel_degree = 2\npipeline_parallel_schedule = \"Interleaved1F1B\"\n"
                                  "[activation_checkpoint]\nmode = \"full\"\n",
                                  "tt", profiles(), o);
  EXPECT_EQ(j.plan.vpp, 2);
  EXPECT_EQ(j.plan.ga, 4);
  EXPECT_EQ(j.plan.zero, 1);
  EXPECT_TRUE(any_contains(j.warnings, "8, 9, 8, 7"));
  // every rank a pipeline stage (dp_shard = 1): no FSDP, zero=0
  o.world = 2;
  const StackJob alone = import_stack(Stack::torchtitan,
                                      "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[parallelism]\npipeline_parallel_degree = 2\n"
                                      "[activation_checkpoint]\nmode = \"full\"\n",
                                      "tt", profiles(), o);
  EXPECT_TRUE(same_plan(alone.plan, parse_plan("dp=1,pp=2,zero=0,ga=8,recompute=full"))) << plan_to_string(alone.plan);
}

TEST(StackImport, DeepSpeedJsonMapsToDocumentedPlan) {
  // train_batch_size 64 = micro 1 x accumulation 8 x 8 ranks; stage 3 with optimizer and parameters on the CPU
  StackJob j = import_stack(Stack::deepspeed, slurp(data("ds_config_zero3_offload.json")), "ds", profiles());
  EXPECT_TRUE(same_plan(j.plan, parse_plan("dp=8,zero=3,ga=8,opt_offload=1,param_offload=1"))) << plan_to_string(j.plan);
  EXPECT_TRUE(any_contains(j.warnings, "zero_optimization.overlap_comm"));
  EXPECT_TRUE(any_contains(j.warnings, "recompute"));
  EXPECT_TRUE(any_contains(j.ignored, "optimizer.type"));
}

TEST(StackImport, ArcticYamlMapsToDocumentedPlan) {
  SKIP_UNLESS_READABLE(Stack::arctic);
  // sequence_parallel_size 8 = Ulysses over 8 GPUs; checkpoints on (HF gradient checkpointing) and offloaded;
  // tiled_mlp_compute = ALST TiledMLP (auto shards); Liger model = tiled loss; max_length 500_000.
  ImportOptions o;
  o.world = 8;
  StackJob j = import_stack(Stack::arctic, slurp(data("arctic_sp8_llama_8b.yml")), "arctic", profiles(), o);
  EXPECT_TRUE(same_plan(j.plan, parse_plan("dp=1,cp=8,cp_kind=ulysses,zero=3,recompute=full,ckpt_offload=1,opt_offload=1,"
                                           "tiled_mlp=auto,tiled_loss=4096")))
      << plan_to_string(j.plan);
  EXPECT_EQ(j.model, "Llama-3.1-8B");  // meta-llama/Llama-3.1-8B-Instruct
  EXPECT_EQ(j.seq, 500000);
  EXPECT_TRUE(any_contains(j.warnings, "deepspeed.seq_parallel_communication_data_type"));
}

TEST(StackImport, ArcticWithoutZeroSectionUsesTrainerDefaultStage2) {
  SKIP_UNLESS_READABLE(Stack::arctic);
  StackJob j = import_stack(Stack::arctic, "model:\n  name_or_path: Qwen/Qwen3-4B\ndata:\n  max_length: 8_000\n", "a", profiles());
  EXPECT_EQ(j.plan.zero, 2);
  EXPECT_EQ(j.plan.recompute, Recompute::full);
  EXPECT_EQ(j.plan.precision, Precision::bf16);
  EXPECT_EQ(j.model, "Qwen3-4B");
  EXPECT_EQ(j.seq, 8000);
}

// ---- options that change the answer and cannot be modelled are refused, naming the option ------

TEST(StackImport, RefusesWhatChangesTheAnswer) {
  SKIP_UNLESS_READABLE(Stack::torchtitan);
  SKIP_UNLESS_READABLE(Stack::arctic);
  const std::string shape = " --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096";
  // an uneven pipeline split is read (pp_first); one Megatron would refuse is refused by plan_check,
  // naming pp_first (tests/test_pipeline_stages.cpp)
  {
    ImportOptions o;
    o.world = 16;
    const StackJob j = import_stack(Stack::megatron, "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 12" + shape,
                                    "cfg", profiles(), o);
    EXPECT_EQ(j.plan.pp, 2);
    EXPECT_EQ(j.plan.pp_first, 12);
    EXPECT_EQ(j.plan.pp_last, 0);
  }
  std::string e;
  e = import_error(Stack::megatron, "--recompute-granularity full --recompute-method block --recompute-num-layers 4" + shape);
  EXPECT_NE(e.find("--recompute-method"), std::string::npos) << e;
  e = import_error(Stack::megatron, "--cp-comm-type ring" + shape);
  EXPECT_NE(e.find("valid: p2p"), std::string::npos) << e;
  e = import_error(Stack::megatron, "--context-parallel-size 8 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2" + shape);
  EXPECT_NE(e.find("--hierarchical-context-parallel-sizes"), std::string::npos) << e;
  e = import_error(Stack::megatron, "--optimizer-cpu-offload --optimizer-offload-fraction 0.5" + shape);
  EXPECT_NE(e.find("--optimizer-offload-fraction"), std::string::npos) << e;
  e = import_error(Stack::megatron, "--tensor-model-parallel-size $TP" + shape);
  EXPECT_NE(e.find("shell variable"), std::string::npos) << e;
  // HSDP (issue 21): optimizer instances are the distributed optimizer's; 3 does not split 16 ranks
  e = import_error(Stack::megatron, "--num-distributed-optimizer-instances 2" + shape);
  EXPECT_NE(e.find("--use-distributed-optimizer"), std::string::npos) << e;
  e = import_error(Stack::megatron, "--use-distributed-optimizer --num-distributed-optimizer-instances 3" + shape);
  EXPECT_NE(e.find("valid: a divisor of 16"), std::string::npos) << e;

  const std::string tt = "[model]\nname = \"llama3\"\nflavor = \"8B\"\n";
  // HSDP (issue 21): replicate 2 x shard -1 cannot size its shard group without the job's GPUs
  e = import_error(Stack::torchtitan, tt + "[parallelism]\ndata_parallel_replicate_degree = 2\n"
                                           "[activation_checkpoint]\nmode = \"full\"\n",
                   0);
  EXPECT_NE(e.find("parallelism.data_parallel_shard_degree"), std::string::npos) << e;
  e = import_error(Stack::torchtitan, tt);  // torchtitan's default: selective, every 2nd layer
  EXPECT_NE(e.find("activation_checkpoint.selective_ac_option"), std::string::npos) << e;
  const std::string full = "[activation_checkpoint]\nmode = \"full\"\n";
  e = import_error(Stack::torchtitan, tt + full + "[parallelism]\npipeline_parallel_degree = 4\npipeline_parallel_schedule = \"GPipe\"\n");
  EXPECT_NE(e.find("valid: 1F1B, Interleaved1F1B"), std::string::npos) << e;
  e = import_error(Stack::torchtitan, tt + full + "[parallelism]\npipeline_parallel_degree = 4\nfsdp_reshard_after_forward = \"always\"\n");
  EXPECT_NE(e.find("parallelism.fsdp_reshard_after_forward"), std::string::npos) << e;
  e = import_error(Stack::torchtitan, tt + full + "[parallelism]\npipeline_parallel_degree = 4\ndata_parallel_replicate_degree = 4\n"
                                                  "data_parallel_shard_degree = 1\n");
  EXPECT_NE(e.find("DDP has not supported"), std::string::npos) << e;
  e = import_error(Stack::torchtitan, tt + full + "[parallelism]\ntensor_parallel_degree = 2\ndata_parallel_replicate_degree = 8\n"
                                                  "data_parallel_shard_degree = 1\n");
  EXPECT_NE(e.find("tensor_parallel_degree = 2: torchtitan's DDP runs alone"), std::string::npos) << e;
  e = import_error(Stack::torchtitan, tt + full + "[training]\nlocal_batch_size = 6\n[parallelism]\npipeline_parallel_degree = 4\n"
                                                  "pipeline_parallel_microbatch_size = 4\n");
  EXPECT_NE(e.find("valid: a divisor of 6"), std::string::npos) << e;
  e = import_error(Stack::torchtitan, "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n");
  EXPECT_NE(e.find("model.flavor"), std::string::npos) << e;

  e = import_error(Stack::deepspeed, R"({"zero_optimization": {"stage": 2, "mics_shard_size": 8}})");
  EXPECT_NE(e.find("zero_optimization.mics_shard_size"), std::string::npos) << e;
  e = import_error(Stack::deepspeed, R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})");
  EXPECT_NE(e.find("zero_optimization.offload_param"), std::string::npos) << e;
  e = import_error(Stack::deepspeed, R"({"train_batch_size": 60, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8})");
  EXPECT_NE(e.find("train_batch_size"), std::string::npos) << e;
  e = import_error(Stack::arctic, "model:\n  name_or_path: nobody/NoSuchModel-9B\n");
  EXPECT_NE(e.find("model.name_or_path"), std::string::npos) << e;
}

TEST(StackImport, MalformedFilesNameTheLine) {
  SKIP_UNLESS_READABLE(Stack::torchtitan);
  SKIP_UNLESS_READABLE(Stack::arctic);
  std::string e = import_error(Stack::torchtitan, "[training]\nseq_len = = 3\n");
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  e = import_error(Stack::arctic, "model:\n  name_or_path: [unclosed\n");
  EXPECT_NE(e.find("malformed YAML"), std::string::npos) << e;
  e = import_error(Stack::deepspeed, "{\"zero_optimization\": {\"stage\": 3,}}");
  EXPECT_NE(e.find("cfg"), std::string::npos) << e;
  EXPECT_THROW(parse_stack("megatorn", "import"), InputError);
}

// ---- the CLI: import writes a plan file every command takes; export writes the stack's file -----

TEST(StackCli, ImportedPlanFilePredictsAndExportsBack) {
  SKIP_UNLESS_READABLE(Stack::arctic);
  const fs::path dir = fs::temp_directory_path() / ("ctxplan_stacks_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string plan = (dir / "plan.json").string();
  auto r = ctx::testing::run_process(CTXPLAN_BIN, {"import", "arctic", data("arctic_sp8_llama_8b.yml"), "--cluster", "8xh100",
                                                   "-o", plan});
  ASSERT_EQ(r.exit_code, 0) << r.both();
  EXPECT_NE(r.err.find("warning: model.type liger"), std::string::npos) << r.both();
  r = ctx::testing::run_process(CTXPLAN_BIN, {"predict", "--plan-file", plan, "--json"});
  EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 3) << r.both();
  EXPECT_NE(r.out.find("\"cp_kind\": \"ulysses\""), std::string::npos);
  const std::string yml = (dir / "back.yml").string();
  r = ctx::testing::run_process(CTXPLAN_BIN, {"export", "arctic", "--plan-file", plan, "-o", yml});
  ASSERT_EQ(r.exit_code, 0) << r.both();
  EXPECT_NE(r.out.find("arctic_training back.yml --num_gpus 8"), std::string::npos) << r.out;
  const std::string plan2 = (dir / "plan2.json").string();
  r = ctx::testing::run_process(CTXPLAN_BIN, {"import", "arctic", yml, "--cluster", "8xh100", "-o", plan2});
  ASSERT_EQ(r.exit_code, 0) << r.both();
  EXPECT_EQ(json::parse(slurp(plan))["plan"], json::parse(slurp(plan2))["plan"]);
  fs::remove_all(dir);
}

TEST(StackCli, BadInputExitsTwoNamingTheFileAndOption) {
  auto r = ctx::testing::run_process(CTXPLAN_BIN, {"import", "megatron", "/nonexistent/args.sh"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/args.sh"), std::string::npos) << r.err;
  r = ctx::testing::run_process(CTXPLAN_BIN, {"import", "torch", data("torchtitan_llama3_8b_cp8.toml")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("torchtitan"), std::string::npos) << r.err;
  r = ctx::testing::run_process(CTXPLAN_BIN, {"import", "megatron", data("megatron_llama3_8b_128k.sh"), "--set", "cp_kind=ringg"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cp_kind"), std::string::npos) << r.err;
  r = ctx::testing::run_process(CTXPLAN_BIN, {"export", "megatron", "--model", "Llama-3.1-8B", "--cluster", "8xh100",
                                              "--plan", "tp=3"});
  EXPECT_EQ(r.exit_code, 2) << r.both();
  r = ctx::testing::run_process(CTXPLAN_BIN, {"export", "torchtitan"});
  EXPECT_EQ(r.exit_code, 2) << r.both();
  EXPECT_NE(r.err.find("needs a plan"), std::string::npos) << r.err;
}

TEST(StackImport, HostileValuesAreRefusedWithoutCrashing) {
  SKIP_UNLESS_READABLE(Stack::torchtitan);
  SKIP_UNLESS_READABLE(Stack::arctic);
  const std::string shape = " --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096";
  // degrees whose product would overflow are refused at the option
  std::string e = import_error(Stack::megatron, "--tensor-model-parallel-size 4611686018427387904 --context-parallel-size 4" + shape);
  EXPECT_NE(e.find("--tensor-model-parallel-size"), std::string::npos) << e;
  e = import_error(Stack::torchtitan, "[model]\nflavor = \"8B\"\n[parallelism]\ncontext_parallel_degree = 9223372036854775807\n");
  EXPECT_NE(e.find("parallelism.context_parallel_degree"), std::string::npos) << e;
  e = import_error(Stack::deepspeed, R"({"train_micro_batch_size_per_gpu": 1e300})");
  EXPECT_NE(e.find("train_micro_batch_size_per_gpu"), std::string::npos) << e;
  // nesting deeper than any trainer config is refused before the recursive YAML parser sees it
  e = import_error(Stack::arctic, "model: " + std::string(100000, '[') + "\n");
  EXPECT_NE(e.find("nesting"), std::string::npos) << e;
  // a value a megabyte long is quoted as an excerpt
  e = import_error(Stack::megatron, "--tensor-model-parallel-size " + std::string(1 << 20, '9') + shape);
  EXPECT_LT(e.size(), 1000u);
}

TEST(StackExport, AModelWithoutATorchtitanFlavorIsListedNotFatal) {
  SKIP_UNLESS_READABLE(Stack::torchtitan);
  ExportJob j = job_for("cp=2,zero=3,recompute=full");
  j.model = resolve_model(profiles(), "SmolLM3-3B");
  j.model_arg = "SmolLM3-3B";
  StackExport e = export_stack(Stack::torchtitan, j, profiles());
  EXPECT_TRUE(any_contains(e.cannot_express, "model SmolLM3-3B")) << stacks::join(e.cannot_express, "\n");
  EXPECT_TRUE(same_plan(j.plan, e.exported));  // the plan itself goes through
}
