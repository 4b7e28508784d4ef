// ZeroMQ CURVE on the cluster's links: key pairs and their files, the CURVE options of
// a socket, and the ZAP handler that decides which client keys a worker's ROUTER
// accepts. Keys are Z85 text (40 characters), as zmq_curve_keypair writes them.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

namespace pico::net {

constexpr size_t kZ85KeyChars = 40;

struct KeyPair {
  std::string public_key;  // Z85
  std::string secret_key;  // Z85
};

// The CURVE side of one socket. A server (a worker's ROUTER) needs its own key pair;
// a client (a DEALER) its own pair and the server's public key.
struct Curve {
  KeyPair own;
  std::string server_key;  // clients only
};

KeyPair generate_key_pair();
// 40 characters of the Z85 alphabet that decode to 32 bytes.
bool is_z85_key(const std::string& text);
// The public key of a Z85 secret key (throws std::invalid_argument for a bad key).
std::string public_key_of(const std::string& secret_key);

// Key files hold one Z85 key (a trailing newline is fine). Each reader throws
// std::runtime_error naming the file and what is wrong with it.
KeyPair read_secret_key_file(const std::string& path);   // the public key is derived
std::string read_public_key_file(const std::string& path);
// A Z85 public key as given on a command line or in cluster.toml: the key itself, or
// the path of a file holding it.
std::string public_key_from(const std::string& key_or_path);
// One Z85 public key per line; blank lines and lines starting with '#' are skipped.
std::vector<std::string> read_authorized_keys(const std::string& path);
// Writes NAME.public and NAME.secret (mode 0600); refuses to overwrite either.
KeyPair write_key_files(const std::string& name);

// Sets the CURVE options (before bind or connect).
void set_curve_server(zmq::socket_t& socket, const KeyPair& own);
void set_curve_client(zmq::socket_t& socket, const Curve& curve);

// The ZAP handler (RFC 27) of this process's context: CURVE clients whose public key
// is authorized (the fixed list, plus the keys the current session added) get in,
// every other one is refused with 400 during the handshake. libzmq lets every client
// in while no handler is bound, so construct it before the socket it guards binds.
// One per process (the endpoint is fixed).
class ZapAuthenticator {
 public:
  // Called from the handler's thread for each refused client: its address and key.
  using Refused = std::function<void(const std::string& address, const std::string& key)>;
  explicit ZapAuthenticator(std::vector<std::string> authorized, Refused on_refused = {});
  ~ZapAuthenticator();
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;
  // Replaces the keys accepted besides the fixed list (a plan's acceptKeys).
  void set_session_keys(const std::vector<std::string>& keys);
  bool accepts(const std::string& key) const;

 private:
  void run();
  void answer(std::vector<zmq::message_t>& request);

  zmq::socket_t socket_;
  std::set<std::string> authorized_;
  std::set<std::string> session_keys_;
  Refused on_refused_;
  mutable std::mutex mutex_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace pico::net
