#include "curve.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "net.hpp"

namespace pico::net {

namespace {

// Key files are tiny; anything larger is not one (and is not read into memory whole).
constexpr std::streamsize kMaxKeyFileBytes = 4096;
constexpr std::streamsize kMaxAuthorizedKeysBytes = 1 << 20;

std::string read_small_file(const std::string& path, std::streamsize limit, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + std::string(what) + " " + path + ": " + std::strerror(errno));
  std::string text(static_cast<size_t>(limit) + 1, '\0');
  in.read(text.data(), limit + 1);
  if (in.gcount() > limit) {
    throw std::runtime_error(std::string(what) + " " + path + " is larger than " + std::to_string(limit) +
                             " bytes: not a key file");
  }
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

std::string printable(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 48)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return s.size() > 48 ? out + "..." : out;
}

std::string one_key(const std::string& path, const char* what) {
  const std::string key = trim(read_small_file(path, kMaxKeyFileBytes, what));
  if (!is_z85_key(key)) {
    throw std::runtime_error(std::string(what) + " " + path + " does not hold a Z85 key (40 characters, as " +
                             "`pico keygen` writes): '" + printable(key) + "'");
  }
  return key;
}

void write_new_file(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  const ssize_t n = ::write(fd, text.data(), text.size());
  const bool ok = n == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
}

}  // namespace

KeyPair generate_key_pair() {
  char pub[kZ85KeyChars + 1], sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) {
    throw std::runtime_error(std::string("cannot make a CURVE key pair: ") + zmq_strerror(zmq_errno()));
  }
  return {pub, sec};
}

bool is_z85_key(const std::string& text) {
  if (text.size() != kZ85KeyChars) return false;
  uint8_t bytes[32];
  return zmq_z85_decode(bytes, text.c_str()) != nullptr;
}

std::string public_key_of(const std::string& secret_key) {
  if (!is_z85_key(secret_key)) throw std::invalid_argument("not a Z85 secret key");
  char pub[kZ85KeyChars + 1];
  if (zmq_curve_public(pub, secret_key.c_str()) != 0) throw std::invalid_argument("not a Z85 secret key");
  return pub;
}

KeyPair read_secret_key_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    throw std::runtime_error("secret key file " + path + " is readable by other users (chmod 600 " + path + ")");
  }
  KeyPair k;
  k.secret_key = one_key(path, "secret key file");
  k.public_key = public_key_of(k.secret_key);
  return k;
}

std::string read_public_key_file(const std::string& path) { return one_key(path, "public key file"); }

std::string public_key_from(const std::string& key_or_path) {
  if (is_z85_key(key_or_path)) return key_or_path;
  return read_public_key_file(key_or_path);
}

std::vector<std::string> read_authorized_keys(const std::string& path) {
  const std::string text = read_small_file(path, kMaxAuthorizedKeysBytes, "authorized keys file");
  std::vector<std::string> keys;
  size_t line_no = 0, start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string line = trim(text.substr(start, end - start));
    ++line_no;
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    if (!is_z85_key(line)) {
      throw std::runtime_error(path + ":" + std::to_string(line_no) + ": not a Z85 public key (40 characters): '" +
                               printable(line) + "'");
    }
    keys.push_back(line);
  }
  if (keys.empty()) throw std::runtime_error("authorized keys file " + path + " lists no key");
  return keys;
}

KeyPair write_key_files(const std::string& name) {
  const std::string pub = name + ".public", sec = name + ".secret";
  for (const auto& p : {pub, sec}) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0) throw std::runtime_error(p + " exists: not overwritten");
  }
  const KeyPair k = generate_key_pair();
  write_new_file(sec, k.secret_key + "\n", 0600);
  write_new_file(pub, k.public_key + "\n", 0644);
  return k;
}

void set_curve_server(zmq::socket_t& socket, const KeyPair& own) {
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, own.secret_key);
  // A ZAP domain makes every handshake go through the handler (ZapAuthenticator).
  socket.set(zmq::sockopt::zap_domain, "pico");
}

void set_curve_client(zmq::socket_t& socket, const Curve& curve) {
  socket.set(zmq::sockopt::curve_serverkey, curve.server_key);
  socket.set(zmq::sockopt::curve_publickey, curve.own.public_key);
  socket.set(zmq::sockopt::curve_secretkey, curve.own.secret_key);
}

// ---- ZapAuthenticator -------------------------------------------------------

ZapAuthenticator::ZapAuthenticator(std::vector<std::string> authorized, Refused on_refused)
    : socket_(context(), zmq::socket_type::rep),
      authorized_(authorized.begin(), authorized.end()),
      on_refused_(std::move(on_refused)) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::rcvtimeo, 100);  // the stop flag is looked at this often
  socket_.bind("inproc://zeromq.zap.01");  // before any guarded socket binds: see above
  thread_ = std::thread([this] { run(); });
}

ZapAuthenticator::~ZapAuthenticator() {
  stop_ = true;
  thread_.join();
  // Closing unbinds later, in libzmq's reaper: unbind now so that a next one can bind.
  try {
    socket_.unbind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t&) {
  }
}

void ZapAuthenticator::set_session_keys(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  session_keys_ = {keys.begin(), keys.end()};
}

bool ZapAuthenticator::accepts(const std::string& key) const {
  std::lock_guard lock(mutex_);
  return authorized_.count(key) > 0 || session_keys_.count(key) > 0;
}

void ZapAuthenticator::run() {
  while (!stop_.load()) {
    std::vector<zmq::message_t> request;
    try {
      zmq::message_t first;
      if (!socket_.recv(first)) continue;  // timed out
      bool more = first.more();
      request.push_back(std::move(first));
      while (more) {
        zmq::message_t m;
        if (!socket_.recv(m)) break;
        more = m.more();
        request.push_back(std::move(m));
      }
      answer(request);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      // EINTR and the like: go on; a REP socket left mid-exchange is reset by libzmq.
    }
  }
}

void ZapAuthenticator::answer(std::vector<zmq::message_t>& request) {
  // RFC 27: version, request id, domain, address, routing id, mechanism, credentials.
  std::string status = "400", text = "not authorized";
  std::string key, address;
  if (request.size() >= 6) address = request[3].to_string();
  if (request.size() == 7 && request[0].to_string() == "1.0" && request[5].to_string() == "CURVE" &&
      request[6].size() == 32) {
    char z85[kZ85KeyChars + 1];
    if (zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), 32)) key = z85;
    if (!key.empty() && accepts(key)) status = "200", text = "OK";
  } else {
    text = "only CURVE clients are accepted";
  }
  if (status != "200" && on_refused_) on_refused_(address, key);
  const auto more = zmq::send_flags::sndmore;
  (void)socket_.send(zmq::str_buffer("1.0"), more);
  if (request.size() >= 2) {
    (void)socket_.send(request[1], more);
  } else {
    (void)socket_.send(zmq::str_buffer(""), more);
  }
  (void)socket_.send(zmq::buffer(status), more);
  (void)socket_.send(zmq::buffer(text), more);
  (void)socket_.send(zmq::buffer(key), more);  // user id
  (void)socket_.send(zmq::str_buffer(""));     // metadata
}

}  // namespace pico::net
