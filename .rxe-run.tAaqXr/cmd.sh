cd /work/main
export PATH=/opt/bin:$PATH HOME=/tmp
tests/rxe/suite.sh build put_get put_get put_get 
