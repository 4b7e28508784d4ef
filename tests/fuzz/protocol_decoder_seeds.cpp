// Writes protocol_decoder_fuzz's seed corpus: one valid message of every kind.
//   protocol_decoder_fuzz_seeds DIR
#include "message_seeds_main.hpp"

int main(int argc, char** argv) { return pico::fuzz::write_message_seeds(argc, argv, false); }
