# Router and `pdserve up` tests (helper "router"): their own binary, started real processes.
pdserve_add_test(router_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/router_test.cc ${CMAKE_CURRENT_SOURCE_DIR}/up_test.cc
          ${CMAKE_CURRENT_SOURCE_DIR}/router_retry_test.cc
          ${CMAKE_CURRENT_SOURCE_DIR}/router_cancel_test.cc
          ${CMAKE_CURRENT_SOURCE_DIR}/router_keepalive_test.cc
          ${CMAKE_CURRENT_SOURCE_DIR}/cluster_auth_test.cc
          ${CMAKE_CURRENT_SOURCE_DIR}/drain_test.cc
          ${CMAKE_CURRENT_SOURCE_DIR}/router_framing_test.cc
          ${CMAKE_CURRENT_SOURCE_DIR}/router_test_util.cc
          ${CMAKE_CURRENT_SOURCE_DIR}/raw_http_client.cc
  LIBS pdserve_router pdserve_test_models LABELS threaded TIMEOUT 300)
