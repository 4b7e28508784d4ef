// pico keygen NAME: a CURVE key pair for pico-worker / pico-coord (NAME.public and
// NAME.secret, Z85 text as zmq_curve_keypair writes it; the secret file mode 0600).
#include <iostream>
#include <memory>
#include <string>

#include "commands.hpp"
#include "curve.hpp"

namespace pico::cli {

void add_keygen_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("keygen", "write a CURVE key pair: NAME.public and NAME.secret (never overwritten)");
  auto name = std::make_shared<std::string>();
  cmd->add_option("NAME", *name, "path prefix of the two files")->required();
  cmd->callback([name] {
    const net::KeyPair keys = net::write_key_files(*name);
    std::cout << keys.public_key << "\n";  // the public key, for authorized-keys files
    std::cerr << "wrote " << *name << ".public and " << *name << ".secret (keep the secret file private)\n";
  });
}

}  // namespace pico::cli
