// mixtune as a library: inspect and load a checkpoint, score a batch, fine-tune from a recipe, load and save the
// result. Prints one JSON object per event so that a script can check it (scripts/check-install.sh).
//   mixtune_consumer CHECKPOINT RECIPE.yaml OUT_DIR
#include <mixtune/mixtune.h>

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s CHECKPOINT RECIPE.yaml OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const mixtune::ModelInfo info = mixtune::Model::inspect(argv[1]);
    std::printf("{\"event\": \"inspect\", \"architecture\": \"%s\", \"layers\": %lld, \"parameters\": %lld}\n",
                info.architecture.c_str(), static_cast<long long>(info.layers),
                static_cast<long long>(info.parameters.total));

    mixtune::Model model = mixtune::Model::from_pretrained(argv[1], {.dtype = "float32"});
    const std::vector<mixtune::Sequence> batch = {{{5, 17, 99, 3, 42, 7}, {}}, {{100, 64, 1, 27, 88, 9}, {}}};
    const mixtune::ScoreResult before = model.score(batch);
    std::printf("{\"event\": \"score\", \"loss\": %.9g, \"tokens\": %lld}\n", before.loss,
                static_cast<long long>(before.tokens));

    mixtune::FinetuneOptions options;
    options.set = {"optimizer.decay_norms_and_biases=true"};
    options.quiet = true;
    options.on_step = [](const mixtune::StepMetrics& m) {
      std::printf("{\"event\": \"step\", \"step\": %lld, \"loss\": %.9g}\n", static_cast<long long>(m.step), m.loss);
    };
    const mixtune::FinetuneResult r = mixtune::finetune(argv[2], options);

    mixtune::Model tuned = mixtune::Model::from_pretrained(r.final_dir);
    const mixtune::ScoreResult after = tuned.score(batch);
    tuned.save_pretrained(argv[3]);
    std::printf("{\"event\": \"done\", \"steps\": %lld, \"loss_after\": %.9g, \"saved\": \"%s\"}\n",
                static_cast<long long>(r.steps), after.loss, argv[3]);
  } catch (const mixtune::Error& e) {
    std::fprintf(stderr, "mixtune_consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
