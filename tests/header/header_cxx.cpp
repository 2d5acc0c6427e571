// hixl.h must compile alone as C++ and link.
#include <hixl.h>

#include <cstring>

int main()
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  hixl_xfer_t x = {nullptr, nullptr, 0, 0};
  (void)x;
  return std::strncmp(hixl_strerror(HIXL_OK), "HIXL_OK", 7) == 0 ? 0 : 1;
}
