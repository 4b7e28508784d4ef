// Writes worker_message_fuzz's seed corpus: every message a stage serves, shaped for
// the fuzz model's two stages.
//   worker_message_fuzz_seeds DIR
#include "message_seeds_main.hpp"

int main(int argc, char** argv) { return pico::fuzz::write_message_seeds(argc, argv, true); }
