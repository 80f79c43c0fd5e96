// loom's RPC over the message layer: net::rpc_server and net::channel.
//
//   struct add_req { int a, b; template <class A> void serialize(A& ar) { ar(a, b); } };
//
//   net::rpc_server srv({.host = "127.0.0.1", .port = 0});
//   srv.handle("add", [](net::request req, net::responder r) {
//     auto m = req.metadata<add_req>();
//     r.reply(m.a + m.b, std::move(req.payloads())); // echo the tensors back
//   });
//   net::channel ch("127.0.0.1:" + std::to_string(srv.port()), {.peer_name = "ps task 0"});
//   net::response res = ch.call("add", add_req{2, 3}, {t}, {.timeout = std::chrono::seconds(5)});
//   int sum = res.metadata<int>();   // res.payloads[0] holds t's bytes
//
// Wire format, handshake and limits: docs/wire-protocol.md.
#pragma once

#include <loom/net/auth.hpp>
#include <loom/net/channel.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/server.hpp>
